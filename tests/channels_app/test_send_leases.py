"""Outcomes written as answers arrive, calls with a total deadline, leases that hold while a batch runs.

Real workers against a webhook receiver on 127.0.0.1 that records which delivery each request carried
(`webhook-id` is `dlv_<id>`) and what it answered.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from channels_app.providers.base import DeadlineExceeded, OutboundMessage
from channels_app.providers.webhook import WebhookProvider
from notifier.deliveries.models import Delivery, DeliveryEvent
from notifier.deliveries.outbox import relay
from tests.batches import make_batch, publish_as_one, webhook_template
from tests.conftest import wait_for
from tests.stubs.config import WEBHOOK_SECRET
from tests.stubs.http import StubResponse
from tests.stubs.webhook import TimedReceiver

NO_LIMIT = json.dumps({"webhook": {"rate": 100000, "burst": 100000}})


def _statuses(ids: list[int]) -> Counter[str]:
    return Counter(Delivery.objects.filter(pk__in=ids).values_list("status", flat=True))


def _relay_with_lease(lease: int) -> dict[str, int]:
    """Run the outbox relay as a worker with this lease would (what hands expired leases to a worker)."""
    with override_settings(SENDING_LEASE_SECONDS=lease):
        return relay()


def _sent_while_relaying(ids: list[int], *, lease: int, every: float, timeout: float) -> None:
    """Run the relay (as a worker with `lease` would) every `every` seconds until every delivery is sent."""
    stop = threading.Event()

    def relay_loop() -> None:
        try:
            while not stop.is_set():
                _relay_with_lease(lease)
                stop.wait(every)
        finally:
            connection.close()  # this thread's own connection: the test database is dropped afterwards

    loop = threading.Thread(target=relay_loop, daemon=True)
    loop.start()
    try:
        wait_for(lambda: _statuses(ids)["sent"] == len(ids), timeout=timeout, interval=0.5)
    finally:
        stop.set()
        loop.join(timeout=30)


@pytest.mark.django_db(transaction=True)
def test_sigkill_mid_batch_repeats_at_most_the_calls_in_flight(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str]
) -> None:
    """Kill the worker a third of the way through a 1,500-delivery batch against a 50 ms receiver."""
    webhook_template()
    receiver.respond(200, b'{"ok":true}', delay=0.05)
    ids = make_batch(n=1500, address=f"{receiver.url}/hooks")
    lease, concurrency = 3, 16
    env = {
        **webhook_env,
        "WEBHOOK_PROVIDERS": "webhook",
        "SENDING_LEASE_SECONDS": str(lease),
        "PROVIDER_CONCURRENCY": str(concurrency),
        "PROVIDER_RATE_LIMITS": NO_LIMIT,
    }
    worker = start_worker(queues=["webhook.high"], env=env, concurrency=1)
    publish_as_one(ids)
    wait_for(lambda: len(receiver.snapshot()) >= 500, timeout=60, interval=0.05)
    worker.kill()
    worker.proc.wait(timeout=10)
    written_before = _statuses(ids)["sent"]
    acked_before = len(receiver.ok_per_delivery())

    start_worker(queues=["webhook.high"], env=env, concurrency=1)

    def all_sent() -> bool:
        _relay_with_lease(lease)
        return _statuses(ids)["sent"] == len(ids)

    wait_for(all_sent, timeout=120, interval=1.0)
    ok = receiver.ok_per_delivery()
    twice = {i: n for i, n in ok.items() if n > 1}
    print(
        f"\nSIGKILL after {acked_before} answers ({written_before} written): {len(twice)} of {len(ids)} sent twice"
        f" (calls in flight plus answers not yet written: at most {concurrency})"
    )
    assert set(ok) == set(ids)
    assert written_before >= acked_before - concurrency, "answers were not written as they arrived"
    assert len(twice) <= concurrency, twice
    assert all(n == 2 for n in twice.values())
    # A repeated call goes to the same provider with the same idempotency key (webhook-id names the delivery).
    assert set(Delivery.objects.filter(pk__in=ids).values_list("provider", flat=True)) == {"webhook"}


@pytest.mark.django_db(transaction=True)
def test_a_receiver_dripping_its_answer_for_three_leases_never_gets_a_neighbour_sent_twice(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str]
) -> None:
    """One delivery's answer drips for three leases; the relay runs throughout; every delivery is sent once."""
    webhook_template()
    receiver.respond(200, b'{"ok":true}', delay=0.02)
    ids = make_batch(n=60, address=f"{receiver.url}/hooks")
    slow = ids[5]
    lease = 2
    receiver.add_rule(
        StubResponse(200, b'{"ok":true}', drip=3 * lease + 1.0),
        match=lambda r: r.header("webhook-id") == f"dlv_{slow}",
    )
    env = {
        **webhook_env,
        "WEBHOOK_PROVIDERS": "webhook",
        "SENDING_LEASE_SECONDS": str(lease),
        "PROVIDER_CALL_DEADLINE_SECONDS": "30",
        "PROVIDER_RATE_LIMITS": NO_LIMIT,
    }
    # Two processes: one sends the batch, the other would take anything the relay hands back.
    start_worker(queues=["webhook.high"], env=env, concurrency=2)
    publish_as_one(ids)

    _sent_while_relaying(ids, lease=lease, every=0.5, timeout=60)

    calls = Counter(h.delivery_id for h in receiver.snapshot())
    assert set(calls) == set(ids)
    assert {i: n for i, n in calls.items() if n != 1} == {}
    assert not DeliveryEvent.objects.filter(delivery_id__in=ids, detail__contains="reclaimed").exists()
    assert Delivery.objects.get(pk=slow).attempts == 1


def test_a_dripped_answer_is_cut_off_at_the_call_deadline(receiver: TimedReceiver) -> None:
    """Each byte arrives within the read timeout, yet the call ends at its total deadline."""
    receiver.add_rule(StubResponse(200, b'{"ok":true}', drip=20.0))
    provider = WebhookProvider(signing_secret=WEBHOOK_SECRET, allow_private=True, read_timeout=1.0)
    provider.call_deadline = 1.5
    message = OutboundMessage(
        delivery_id=1, channel="webhook", address=f"{receiver.url}/hooks", content={"body": {}}, idempotency_key="dlv_1"
    )
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as caught:
        provider.send(message)
    elapsed = time.monotonic() - started
    assert caught.value.maybe_sent and caught.value.retriable
    assert elapsed < 4.0, elapsed
    assert len(receiver.requests) == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_batch_longer_than_the_shipped_lease_is_sent_once(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str]
) -> None:
    """With the shipped lease and heartbeat (nothing overridden), a batch that runs 1.4 leases sends nothing twice.

    One provider call at a time, three deliveries answering after 14 s each: the last one is claimed at the start
    and answered 42 s later, past the 30 s lease; only the heartbeat keeps the relay from handing it to the other
    worker process while it waits its turn.
    """
    webhook_template()
    lease = settings.SENDING_LEASE_SECONDS
    assert settings.SENDING_HEARTBEAT_SECONDS == 0, "the shipped heartbeat: a third of the lease"
    per_call = 14.0
    ids = make_batch(n=3, address=f"{receiver.url}/hooks")
    assert per_call * len(ids) > lease * 1.3
    # The answer drips (each byte within the read timeout), so every call lasts its 14 s and ends well.
    receiver.add_rule(StubResponse(200, b'{"ok":true}', drip=per_call))
    env = {
        **webhook_env,
        "WEBHOOK_PROVIDERS": "webhook",
        "PROVIDER_CONCURRENCY": "1",
        "PROVIDER_RATE_LIMITS": NO_LIMIT,
    }
    # Two processes: one sends the batch, the other would take anything the relay hands back.
    start_worker(queues=["webhook.high"], env=env, concurrency=2)
    publish_as_one(ids)

    # The shipped relay: the lease and the interval config/settings.py has.
    _sent_while_relaying(ids, lease=lease, every=settings.OUTBOX_RELAY_INTERVAL_SECONDS, timeout=120)

    calls = Counter(h.delivery_id for h in receiver.snapshot())
    print(f"\n{len(ids)} calls of {per_call:.0f}s each in one batch, lease {lease}s: calls per delivery {dict(calls)}")
    assert set(calls) == set(ids)
    assert {i: n for i, n in calls.items() if n != 1} == {}
    assert not DeliveryEvent.objects.filter(delivery_id__in=ids, detail__contains="reclaimed").exists()
    assert list(Delivery.objects.filter(pk__in=ids).values_list("attempts", flat=True)) == [1] * len(ids)
