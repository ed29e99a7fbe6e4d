"""Infrastructure outages end in delivery: a database cut from the workers, lost messages, a skewed worker clock.

The database is cut from the workers with a TCP relay between them and PostgreSQL (PostgreSQL itself keeps
running); the test process talks to the database directly.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from notifier.deadletters.models import DeadLetter
from notifier.deliveries.models import Delivery
from notifier.deliveries.outbox import relay
from templates_app.services import template_put
from tests.batches import make_batch, publish_as_one, webhook_template
from tests.conftest import purge_all_queues, queue_depth, wait_for
from tests.factories import make_delivery
from tests.stubs.tcp_relay import TcpRelay
from tests.system.test_resilience_e2e import TimedReceiver

CLOCKSKEW = Path(__file__).resolve().parents[1] / "clockskew"


def _statuses(ids: list[int]) -> Counter[str]:
    return Counter(Delivery.objects.filter(pk__in=ids).values_list("status", flat=True))


def _db_url_through(relay_port: int) -> str:
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}@127.0.0.1:{relay_port}/{db['TEST']['NAME']}"


@pytest.mark.django_db(transaction=True)
def test_a_database_cut_longer_than_the_old_retry_budget_ends_in_delivery(
    start_worker: Any, webhook_env: dict[str, str]
) -> None:
    """Messages taken while the database is unreachable are kept (retried), never dead-lettered, then sent."""
    webhook_template()
    db = settings.DATABASES["default"]
    tcp = TcpRelay(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)).start()
    try:
        with TimedReceiver() as receiver:
            env = {
                **webhook_env,
                "WEBHOOK_PROVIDERS": "webhook",
                "DATABASE_URL": _db_url_through(tcp.port),
                "SEND_TASK_DB_RETRY_MAX_SECONDS": "2",
            }
            worker = start_worker(queues=["webhook.high"], env=env, concurrency=1)
            ids = [make_batch(n=1, address=f"{receiver.url}/hooks")[0] for _ in range(20)]
            tcp.cut()
            for delivery_id in ids:
                publish_as_one([delivery_id])  # accepted: committed and published, as the API does
            cut = time.monotonic()

            def retries() -> Counter[str]:
                return Counter(re.findall(r"send_deliveries\[([0-9a-f-]+)\] retry: Retry in", worker.log()))

            # The old task gave up after 8 retries and dead-lettered the message: the cut lasts until a message
            # has been retried more often than that (the retries spaced at most 2 s apart here).
            wait_for(lambda: max(retries().values(), default=0) > 8, timeout=90, interval=1)
            cut_for = time.monotonic() - cut
            print(f"retries per message after {cut_for:.0f}s: {sorted(retries().values())}")
            assert _statuses(ids) == {"queued": 20}
            assert DeadLetter.objects.count() == 0 and queue_depth("dead.webhook") == 0

            tcp.restore()
            back = time.monotonic()
            wait_for(lambda: _statuses(ids) == {"sent": 20}, timeout=60, interval=0.5)
            print(f"\ndatabase cut for {cut_for:.0f}s: all 20 sent {time.monotonic() - back:.1f}s after its return")
            ok = receiver.ok_per_delivery()
            assert set(ok) == set(ids) and set(ok.values()) == {1}
    finally:
        tcp.stop()


@pytest.mark.django_db(transaction=True)
def test_the_relay_republishes_a_lost_message_within_a_minute_but_not_behind_a_backlog() -> None:
    """A queued delivery published over a minute ago whose queue is empty has lost its message."""
    purge_all_queues()
    old = timezone.now() - timedelta(seconds=settings.OUTBOX_REPUBLISH_AFTER_SECONDS + 5)
    lost = make_delivery(channel="sms", status="queued", address="+15005550006", published_at=old)
    fresh = make_delivery(channel="sms", status="queued", address="+15005550007", published_at=timezone.now())

    result = relay()

    assert result["lost"] == 1
    assert queue_depth("sms.high") == 1
    lost.refresh_from_db()
    fresh.refresh_from_db()
    assert lost.published_at is not None and lost.published_at > old
    # Behind a backlog (the queue has a ready message), an old publish is not taken as lost.
    Delivery.objects.filter(pk__in=[lost.pk, fresh.pk]).update(published_at=old)
    assert relay()["lost"] == 0
    assert queue_depth("sms.high") == 1


@pytest.mark.django_db(transaction=True)
def test_a_worker_clock_five_seconds_ahead_still_sends_retries_and_rate_limited_waits_on_time(
    start_worker: Any,
) -> None:
    """Every delivery fails once and 10 share a 5/s limit; a worker 5 s ahead sends them all in seconds."""
    template_put(
        key="skew",
        category="transactional",
        default_locale="en",
        content={"en": {"email": {"subject": "Hi", "text": "Hello"}}},
    )
    ids = make_batch(n=10, address="someone@example.com", channel="email", template_key="skew")
    env = {
        "PYTHONPATH": str(CLOCKSKEW),
        "NOTIFIER_TEST_CLOCK_SKEW": "5",
        "EMAIL_PROVIDERS": "sandbox",
        "SANDBOX_BEHAVIOUR": "email=fail:1",
        "RETRY_BACKOFF_BASE_SECONDS": "0.5",
        "RETRY_BACKOFF_MAX_SECONDS": "1",
        "PROVIDER_RATE_LIMITS": json.dumps({"sandbox": {"rate": 5, "burst": 3, "high_reserve": 0}}),
        "PROVIDER_CIRCUIT_BREAKERS": json.dumps({"sandbox": {"min_calls": 100000}}),
    }
    worker = start_worker(queues=["email.high"], env=env, concurrency=1)
    started = time.monotonic()
    publish_as_one(ids, queue="email.high")

    # Parked retries (not_before in the database's future) would wait for the relay: not within this.
    wait_for(lambda: _statuses(ids) == {"sent": 10}, timeout=40, interval=0.25)
    elapsed = time.monotonic() - started
    print(f"\nworker clock +5 s: 10 deliveries (one retry each, 5/s limit) sent in {elapsed:.1f}s")
    assert "NOTIFIER_TEST_CLOCK_SKEW" not in worker.log()  # the skew is silent; the assertion is on timing
    rows = Delivery.objects.filter(pk__in=ids)
    assert all(d.attempts == 2 for d in rows)  # each really waited for a retry
    assert any(e.detail.startswith("rate_limited") for d in rows for e in d.events.all())
    # sent_at is on the database's clock, not the worker's (5 s ahead): never in the database's future.
    now = timezone.now()
    assert all(d.sent_at is not None and d.sent_at <= now + timedelta(seconds=1) for d in rows)
