"""Query plans on a 1M-row deliveries table: every hot lookup is served by an index, never a sequential scan.

The table is filled in the test database with INSERT … SELECT generate_series and ANALYZEd, with a realistic
shape: most deliveries finished, a few percent waiting (queued, deferred, sending), one in five in-app,
created_at rising with the id (as in production, both being set at insert). The queries are the ones the
code runs (ORM querysets through `.explain()`, the relay's SQL as written in notifier/deliveries/outbox.py, the
retention batch from ops/retention.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from notifier.deliveries.models import Delivery
from notifier.deliveries.partitions import NOTIFICATION, create_partition, delivery_ids_of_notification

N_DELIVERIES = 1_000_000
N_NOTIFICATIONS = 100_000
N_RECIPIENTS = 20_000


def _fill() -> None:
    # The notifications spread over the past N_NOTIFICATIONS * 20 s: each of those days gets its partition.
    today = timezone.now().date()
    for back in range(N_NOTIFICATIONS * 20 // 86400 + 2):
        create_partition(NOTIFICATION, today - timedelta(days=back))
    with connection.cursor() as c:
        c.execute(
            """
            INSERT INTO notifier_apiclient (name, key_prefix, key_hash, allowed_categories, webhook_url,
                                            webhook_secret, is_active, created_at)
            VALUES ('explain', 'exp', repeat('e', 64), '{}', '', '', true, now())
            RETURNING id
            """
        )
        client_id = c.fetchone()[0]
        c.execute(
            """
            INSERT INTO preferences_recipient (user_id, email, phone, locale, timezone, webhook_url, opted_out,
                                               channel_prefs, category_prefs, created_at, updated_at)
            SELECT 'exp-' || g, '', '', 'en', 'UTC', '', false, '{}', '{}', now(), now()
            FROM generate_series(1, %s) g
            """,
            [N_RECIPIENTS],
        )
        c.execute(
            """
            CREATE TEMP TABLE exp_notification ON COMMIT DROP AS
            SELECT g AS n, gen_random_uuid() AS id FROM generate_series(0, %s - 1) g
            """,
            [N_NOTIFICATIONS],
        )
        c.execute(
            """
            INSERT INTO notifier_notification (id, client_id, request_hash, category, template_key, channels,
                payload, user_id, priority, locale, status, fanout_processed, trace_id,
                created_at, updated_at)
            SELECT id, %s, '', 'transactional', 't', '{}', '{}', 'exp-' || n, 'high', '', 'done', 0, '',
                   now() - make_interval(secs => (%s - n) * 20), now()
            FROM exp_notification
            """,
            [client_id, N_NOTIFICATIONS],
        )
        c.execute("SELECT min(id) FROM preferences_recipient WHERE user_id LIKE 'exp-%%'")
        first_recipient = c.fetchone()[0]
        # Status mix by g % 200: 0-1 queued (one unpublished), 2 deferred, 3 scheduled, 4 sending, 5 failed,
        # the rest finished (sent/delivered). Channel by g % 5. Each notification has ten deliveries to ten
        # different recipients (delivery_target_uniq); each recipient has about fifty.
        c.execute(
            """
            INSERT INTO notifier_delivery (notification_id, recipient_id, channel, priority, address, status, reason,
                provider, provider_message_id, attempts, last_error, not_before, published_at, claimed_at,
                sent_at, created_at, updated_at)
            SELECT en.id,
                   %(first)s + ((g / %(notifications)s) * 2000 + g %% 2000) %% %(recipients)s,
                   (ARRAY['push','email','sms','inapp','webhook'])[1 + g %% 5],
                   'high', '',
                   s.status, '',
                   CASE WHEN s.status IN ('sent', 'delivered', 'failed') THEN 'ses' ELSE '' END,
                   CASE WHEN s.status IN ('sent', 'delivered', 'failed') THEN 'm-' || g ELSE '' END,
                   1, '',
                   CASE WHEN s.status IN ('deferred', 'scheduled')
                        THEN now() + make_interval(secs => g %% 7200 - 3600) END,
                   CASE WHEN g %% 200 = 0 THEN NULL ELSE created END,
                   CASE WHEN s.status = 'sending' THEN created END,
                   CASE WHEN s.status IN ('sent', 'delivered') THEN created END,
                   created, created
            FROM generate_series(0, %(n)s - 1) g
            JOIN exp_notification en ON en.n = g %% %(notifications)s
            CROSS JOIN LATERAL (SELECT now() - make_interval(secs => (%(n)s - g) * 2) AS created) t
            CROSS JOIN LATERAL (
                SELECT CASE g %% 200 WHEN 0 THEN 'queued' WHEN 1 THEN 'queued' WHEN 2 THEN 'deferred'
                       WHEN 3 THEN 'scheduled' WHEN 4 THEN 'sending' WHEN 5 THEN 'failed'
                       ELSE CASE WHEN g %% 2 = 0 THEN 'sent' ELSE 'delivered' END END AS status
            ) s
            ORDER BY g
            """,
            {
                "first": first_recipient,
                "recipients": N_RECIPIENTS,
                "n": N_DELIVERIES,
                "notifications": N_NOTIFICATIONS,
            },
        )
        c.execute("ANALYZE notifier_delivery")
        c.execute("ANALYZE notifier_notification")
        c.execute("ANALYZE preferences_recipient")
        c.execute("ANALYZE notifier_deadletter")


@pytest.fixture
def million_deliveries(db: None) -> Iterator[None]:
    """Fill the deliveries table with 1M rows inside the test's transaction (rolled back afterwards)."""
    _fill()
    yield


def _plan(sql: str, params: list | dict | None = None) -> str:
    with connection.cursor() as c:
        c.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in c.fetchall())


# The planner reads an empty partition (the days made ahead) with a sequential scan that
# costs nothing; only a sequential scan with a real cost means rows are read without an index.
_SEQ_SCAN = re.compile(r"Seq Scan on (notifier_delivery\S*) .*?cost=[0-9.]+\.\.([0-9.]+)")


def _assert_indexed(plan: str, index: str | None = None) -> None:
    costly = [(name, float(cost)) for name, cost in _SEQ_SCAN.findall(plan) if float(cost) > 100]
    assert not costly, plan
    if index:
        # On the parent table the index has its own name; each day partition's copy is named after the
        # partition and its columns, so the plan is checked for an index scan of the partition instead.
        assert index in plan or "Index Scan" in plan or "Index Only Scan" in plan, plan


def _sample(column: str, where: str) -> Any:  # a value of any column, straight from the database
    with connection.cursor() as c:
        c.execute(f"SELECT {column} FROM notifier_delivery WHERE {where} LIMIT 1")
        return c.fetchone()[0]


@pytest.mark.slow
@pytest.mark.django_db
def test_hot_lookups_use_indexes(million_deliveries: None) -> None:
    """Every lookup the service runs on deliveries is an index (or bitmap) scan on 1M rows."""
    assert Delivery.objects.count() == N_DELIVERIES
    plans: dict[str, str] = {}

    # Deliveries of a notification (GET /notifications/{id}, cancel): delivery_target_uniq's leading column.
    notification_id = _sample("notification_id", "true")
    # Read as Notification.day_deliveries() reads them: the notification's day gives the id range, so only that
    # day's partition is planned (notifier/deliveries/partitions.py); the fill's deliveries all carry today's ids.
    low, high = delivery_ids_of_notification(timezone.now())
    plans["by notification"] = Delivery.objects.filter(
        notification_id=notification_id, id__gte=low, id__lt=high
    ).explain()
    _assert_indexed(plans["by notification"], "_target_uniq")  # per partition: <partition>_target_uniq

    # Provider callbacks (SES, Twilio) find their delivery by provider message id.
    plans["by provider message id"] = Delivery.objects.filter(provider="ses", provider_message_id="m-123456").explain()
    _assert_indexed(plans["by provider message id"], "delivery_provider_msg_idx")

    # The in-app inbox: newest first, one page.
    from notifier.inbox.selectors import inbox_queryset
    from preferences.models import Recipient

    recipient = Recipient.objects.get(pk=_sample("recipient_id", "channel = 'inapp'"))
    plans["inbox page"] = inbox_queryset(recipient=recipient).order_by("-id")[:21].explain()
    _assert_indexed(plans["inbox page"], "delivery_inbox_idx")
    plans["inbox unread count"] = inbox_queryset(recipient=recipient).filter(read_at__isnull=True).explain()
    _assert_indexed(plans["inbox unread count"], "delivery_inbox_idx")

    # The outbox relay (notifier/deliveries/outbox.py): unpublished, stale, and due deliveries.
    plans["relay unpublished"] = _plan(
        """
        SELECT id, channel, priority FROM notifier_delivery
        WHERE status = 'queued' AND published_at IS NULL AND created_at < now() - make_interval(secs => %s)
        ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
        """,
        [15, 5000],
    )
    _assert_indexed(plans["relay unpublished"], "delivery_outbox_idx")
    plans["relay stale"] = _plan(
        """
        SELECT id, channel, priority FROM notifier_delivery
        WHERE (status = 'queued' AND published_at < now() - make_interval(secs => %s))
           OR (status = 'sending' AND claimed_at < now() - make_interval(secs => %s))
        ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
        """,
        [300, 300, 5000],
    )
    _assert_indexed(plans["relay stale"], "delivery_outbox_idx")
    _assert_indexed(plans["relay stale"], "delivery_inflight_idx")
    plans["due deliveries"] = _plan(
        """
        SELECT id FROM notifier_delivery
        WHERE status IN ('scheduled', 'deferred') AND not_before <= now()
          AND (published_at IS NULL OR not_before < now() - make_interval(secs => %s))
        ORDER BY not_before LIMIT %s FOR UPDATE SKIP LOCKED
        """,
        [60, 5000],
    )
    _assert_indexed(plans["due deliveries"], "delivery_due_idx")

    # Retention (notifier/deliveries/retention.py): the oldest finished deliveries, one batch.
    from notifier.deliveries.partitions import partition_name
    from notifier.deliveries.retention import FINAL_DELIVERY_STATUSES, delivery_id_ceiling, purge_batch_sql

    cutoff = timezone.now() - timedelta(days=7)
    plans["retention boundary probe"] = _plan(
        "SELECT id, created_at FROM notifier_delivery WHERE id >= %s ORDER BY id LIMIT 1", [500_000]
    )
    _assert_indexed(plans["retention boundary probe"], "notifier_delivery_pkey")
    with connection.cursor() as c:
        c.execute("SELECT max(id) FROM notifier_delivery WHERE created_at < %s", [cutoff])
        expected_ceiling = c.fetchone()[0]
    assert delivery_id_ceiling(cutoff) == expected_ceiling
    ceiling = expected_ceiling if expected_ceiling is not None else low
    plans["retention batch"] = _plan(purge_batch_sql(), [ceiling, cutoff, list(FINAL_DELIVERY_STATUSES), 5000])
    # The ceiling's id carries its day: the batch plans no partition of a later day (those made ahead).
    tomorrow = timezone.now().date() + timedelta(days=1)
    assert partition_name("notifier_delivery", tomorrow) not in plans["retention batch"], plans["retention batch"]
    _assert_indexed(plans["retention batch"])

    # A recipient's deliveries (support look-ups in the admin, erasure).
    plans["by recipient"] = Delivery.objects.filter(recipient_id=recipient.pk).order_by("-created_at")[:50].explain()
    _assert_indexed(plans["by recipient"], "delivery_recipient_idx")

    for name, plan in plans.items():
        print(f"--- {name}\n{plan}")
