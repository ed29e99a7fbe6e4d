"""The online migration to partitioned tables, on a populated database of the old schema, while accepts go on.

A database of its own (`test_notifier_<ns>_migration`) is migrated to the last schema before partitioning,
filled with 200,000 notifications, their deliveries and 400,000 events (generate_series), and migrated by
`manage.py migrate` in a subprocess while a writer keeps inserting notifications the way the old code does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings

from notifier.partitions import DAY_SHIFT, MAX_SAFE_ID

ROOT = Path(__file__).resolve().parent.parent
ROWS = int(os.environ.get("PARTITION_MIGRATION_ROWS", "200000"))

FILL = """
INSERT INTO notifier_apiclient (name, key_prefix, key_hash, allowed_categories, scopes, rate_limit, webhook_url,
                                webhook_secret, is_active, created_at)
VALUES ('legacy', 'ntf_leg', repeat('a', 64), '{}', '{send}', '', '', '', true, now());
INSERT INTO preferences_recipient (user_id, email, phone, locale, timezone, webhook_url, opted_out, channel_prefs,
                                   category_prefs, created_at, updated_at)
SELECT 'u' || g, 'u' || g || '@example.com', '', '', 'UTC', '', false, '{}', '{}', now(), now()
FROM generate_series(1, 1000) g;
INSERT INTO notifier_notification (id, client_id, dedup_key, request_hash, category, template_key, channels, payload,
    recipient_id, user_id, priority, locale, send_at_local, strategy, fallback_until, status, fanout_processed,
    trace_id, created_at, updated_at)
SELECT gen_random_uuid(), (SELECT min(id) FROM notifier_apiclient), CASE WHEN g % 10 = 0 THEN 'k' || g END, 'h',
       'transactional', 't', '{email}', '{}', (SELECT min(id) FROM preferences_recipient) + g % 1000,
       'u' || (g % 1000 + 1), 'normal', '', '', 'all', '', CASE WHEN g % 1000 = 0 THEN 'scheduled' ELSE 'done' END,
       0, '', now() - make_interval(secs => g * 20), now()
FROM generate_series(1, %(rows)s) g;
INSERT INTO notifier_delivery (notification_id, recipient_id, channel, priority, address, status, reason, provider,
    provider_message_id, pinned_provider, attempts, last_error, sms_encoding, created_at, updated_at)
SELECT id, recipient_id, 'email', 'normal', 'a@example.com', CASE WHEN status = 'scheduled' THEN 'scheduled'
       ELSE 'sent' END, '', 'ses', 'm-' || id, '', 1, '', '', created_at, now()
FROM notifier_notification;
INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at)
SELECT id, s, '', created_at FROM notifier_delivery, unnest(ARRAY['queued', 'sent']) s;
"""

# What the old code's accept writes: a v4 id, the delivery's id from the table's default, an event.
OLD_ACCEPT = """
WITH n AS (
    INSERT INTO notifier_notification (id, client_id, dedup_key, request_hash, category, template_key, channels,
        payload, recipient_id, user_id, priority, locale, send_at_local, strategy, fallback_until, status,
        fanout_processed, trace_id, created_at, updated_at)
    SELECT gen_random_uuid(), (SELECT min(id) FROM notifier_apiclient), 'during-' || %(n)s, 'h', 'transactional',
           't', '{email}', '{}', (SELECT min(id) FROM preferences_recipient), 'u1', 'normal', '', '', 'all', '',
           'accepted', 0, '', now(), now()
    RETURNING id, recipient_id
), d AS (
    INSERT INTO notifier_delivery (notification_id, recipient_id, channel, priority, address, status, reason,
        provider, provider_message_id, pinned_provider, attempts, last_error, sms_encoding, created_at, updated_at)
    SELECT id, recipient_id, 'email', 'normal', 'a@example.com', 'queued', '', '', '', '', 0, '', '', now(), now()
    FROM n RETURNING id
)
INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at) SELECT id, 'queued', '', now() FROM d
"""


def _manage(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": url, "DEVELOPMENT": "true", "DJANGO_SETTINGS_MODULE": "config.settings"}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def legacy_database() -> Iterator[str]:
    """Yield the URL of a fresh database migrated to the schema before partitioning; drop it afterwards."""
    db = settings.DATABASES["default"]
    name = f"{db['TEST']['NAME']}_migration"
    admin = psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname="postgres", autocommit=True
    )
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{name}"
    try:
        done = _manage(url, "migrate", "notifier", "0012_merge_live", "-v0")
        assert done.returncode == 0, done.stderr[-2000:]
        yield url
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _scalar(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None, sql
    return row[0]


def test_migration_on_a_populated_database_keeps_every_row_and_never_stops_accepts(legacy_database: str) -> None:
    """200k notifications (with deliveries and events) move under partitioned parents; accepts go on throughout."""
    with psycopg.connect(legacy_database, autocommit=True) as conn:
        conn.execute(FILL.replace("%(rows)s", str(ROWS)))
        conn.execute("ANALYZE")
        before = {t: _scalar(conn, f"SELECT count(*) FROM {t}") for t in ("notifier_notification", "notifier_delivery")}
        legacy_id = _scalar(conn, "SELECT id FROM notifier_notification ORDER BY created_at LIMIT 1")
        legacy_delivery = _scalar(conn, "SELECT id FROM notifier_delivery ORDER BY id LIMIT 1")

    stop = threading.Event()
    accepted: list[float] = []
    failures: list[str] = []

    def accept_forever() -> None:
        with psycopg.connect(legacy_database, autocommit=True) as conn:
            n = 0
            while not stop.is_set():
                n += 1
                started = time.monotonic()
                try:
                    conn.execute(OLD_ACCEPT, {"n": n})
                    accepted.append(time.monotonic() - started)
                except psycopg.Error as exc:  # any failed accept fails the test
                    failures.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.005)

    writer = threading.Thread(target=accept_forever)
    writer.start()
    try:
        time.sleep(0.5)
        during_start = len(accepted)
        migrated = _manage(legacy_database, "migrate", "-v0")
        time.sleep(0.5)
    finally:
        stop.set()
        writer.join()
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    assert failures == []
    assert len(accepted) > during_start  # accepts went on while the migration ran
    print(f"accepts during the run: {len(accepted)}, slowest {max(accepted) * 1000:.0f} ms")

    with psycopg.connect(legacy_database, autocommit=True) as conn:
        kinds: dict[str, str] = dict(
            conn.execute(
                "SELECT relname, relkind FROM pg_class WHERE relname IN"
                " ('notifier_notification', 'notifier_delivery', 'notifier_deliveryevent')"
            ).fetchall()
        )
        assert set(kinds.values()) == {"p"}
        # Every row is still there: the old ones in the legacy partitions, those written meanwhile too.
        assert _scalar(conn, "SELECT count(*) FROM notifier_notification") == before["notifier_notification"] + len(
            accepted
        )
        assert _scalar(conn, "SELECT count(*) FROM notifier_delivery") == before["notifier_delivery"] + len(accepted)
        assert _scalar(conn, "SELECT count(*) FROM notifier_deliveryevent") == 2 * ROWS + len(accepted)
        assert _scalar(conn, "SELECT count(*) FROM ONLY notifier_delivery_legacy") == before["notifier_delivery"] + len(
            accepted
        )
        # Legacy ids are found by id; a legacy delivery id prunes to the legacy partition alone.
        assert _scalar(conn, "SELECT count(*) FROM notifier_notification WHERE id = %s", [legacy_id]) == 1
        plan = "\n".join(
            r[0] for r in conn.execute(f"EXPLAIN SELECT * FROM notifier_delivery WHERE id = {legacy_delivery}")
        )
        assert "notifier_delivery_legacy" in plan and "_p20" not in plan
        # The dedup keys of the window are in the key table (the old unique index only sees the legacy rows).
        assert _scalar(conn, "SELECT count(*) FROM notifier_dedupkey") >= 1
        # Day partitions from the cut-over on, and no FK left pointing at the renamed tables.
        assert _scalar(conn, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'notifier_delivery'::regclass") >= 8
        assert (
            _scalar(
                conn,
                "SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND confrelid::regclass::text LIKE '%%_legacy'",
            )
            == 0
        )
        # New code's writes after the swap: a delivery id of today's day lands in the partitioned parent.
        new_id = _scalar(conn, "SELECT notifier_delivery_id(now())")
        assert new_id >> DAY_SHIFT > 0 and new_id <= MAX_SAFE_ID
