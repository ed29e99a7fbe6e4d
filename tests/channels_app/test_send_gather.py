"""Singles travel as batches on the worker: a send task takes the messages waiting on its queue into its batch.

Real RabbitMQ (this namespace's vhost), PostgreSQL and workers; a webhook receiver stands in for the provider
(the `webhook-id` header names the delivery, so a second send of one delivery would show).
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from django.conf import settings
from prometheus_client import REGISTRY

from channels_app import gather as gather_module
from channels_app.gather import Gathered, gather
from config.celery import app as celery_app
from notifier.deadletters.models import DeadLetter
from notifier.deliveries.models import Delivery, DeliveryEvent
from notifier.deliveries.outbox import publish
from tests.batches import make_batch, poison_client, statuses, webhook_template
from tests.conftest import purge_all_queues, queue_depth, wait_for
from tests.stubs.http import RecordedRequest, StubResponse
from tests.stubs.tcp_relay import TcpRelay
from tests.stubs.webhook import TimedReceiver

QUEUE = "webhook.high"


def _singles(n: int, address: str = "http://127.0.0.1:9/hooks") -> list[int]:
    """Write `n` single notifications (one delivery each, each its own notification); return the delivery ids."""
    return [make_batch(n=1, address=address)[0] for _ in range(n)]


def _publish_each(ids: list[int]) -> None:
    """Publish every id as its own broker message, as singles travel."""
    for delivery_id in ids:
        # A publish that failed (a pooled connection a broker restart of an earlier test broke) is tried again.
        wait_for(partial(_published, [delivery_id]), timeout=10)


def _published(ids: list[int]) -> bool:
    return publish({QUEUE: ids}) == ids


def _claims(ids: list[int]) -> dict[int, Any]:
    """Return each delivery's claim time: one claim statement stamps every row it takes with the same now()."""
    return dict(DeliveryEvent.objects.filter(delivery_id__in=ids, status="sending").values_list("delivery_id", "at"))


def _hold_answer(receiver: TimedReceiver, delivery_id: int) -> tuple[threading.Event, threading.Event]:
    """Make the receiver hold its answer to `delivery_id` open; return (held, release) events."""
    held, release = threading.Event(), threading.Event()

    def hold(request: RecordedRequest) -> StubResponse:
        held.set()
        release.wait(60)
        return receiver.default_response(request)

    receiver.add_rule(hold, match=lambda r: r.header("webhook-id") == f"dlv_{delivery_id}", times=1)
    return held, release


def _worker_env(webhook_env: dict[str, str], **extra: str) -> dict[str, str]:
    return {**webhook_env, "WEBHOOK_PROVIDERS": "webhook", "SEND_GATHER_MAX": "16", **extra}


@pytest.fixture
def empty_queues() -> Iterator[None]:
    purge_all_queues()
    yield
    purge_all_queues()


@pytest.mark.django_db(transaction=True)
def test_gather_takes_the_waiting_messages_and_settles_them(empty_queues: None) -> None:
    """Taken messages are not ready for anyone else; put back they are, acknowledged they are gone."""
    webhook_template()
    own, *waiting = _singles(4)
    _publish_each(waiting)
    wait_for(lambda: queue_depth(QUEUE) == 3)

    batch = gather(QUEUE, [own])
    assert batch.ids == [own, *waiting]
    assert len(batch.messages) == 3
    assert queue_depth(QUEUE) == 0  # unacknowledged on the gatherer's channel
    batch.requeue()
    wait_for(lambda: queue_depth(QUEUE) == 3)

    again = gather(QUEUE, [own])
    assert sorted(again.ids) == sorted([own, *waiting])
    again.ack()
    assert again.messages == []
    # Acknowledged: a new connection (as after a worker restart) gets nothing back.
    broker = gather_module._broker_for(QUEUE)
    with broker.lock:
        broker.drop()
    assert gather(QUEUE, [own]).ids == [own]
    assert queue_depth(QUEUE) == 0


@pytest.mark.django_db(transaction=True)
def test_a_lone_single_gathers_nothing_and_the_limit_holds(empty_queues: None, settings: Any) -> None:
    webhook_template()
    lone = gather(QUEUE, [7])
    assert lone.ids == [7] and lone.messages == []

    own, *waiting = _singles(9)
    _publish_each(waiting)
    wait_for(lambda: queue_depth(QUEUE) == 8)
    settings.SEND_GATHER_MAX = 5
    batch = gather(QUEUE, [own])
    assert len(batch.ids) == 5 and len(batch.messages) == 4
    assert queue_depth(QUEUE) == 4
    batch.requeue()
    # A batch already at the limit takes nothing.
    assert gather(QUEUE, list(range(1, 100))).messages == []


@pytest.mark.django_db(transaction=True)
def test_a_slow_count_pauses_the_queues_gathering_and_its_batches_go_as_they_are(
    empty_queues: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker slow to count a queue (a quorum queue whose leader hangs: 250 ms a count) delays one batch, not all."""
    from kombu import Connection

    webhook_template()
    broker = Connection(celery_app.conf.broker_url)
    relay = TcpRelay(broker.hostname or "127.0.0.1", broker.port or 5672).start()
    # The gather connection, alone, goes through the relay; a fresh one (the process's may point elsewhere).
    read_url = broker.clone(hostname="127.0.0.1", port=relay.port).as_uri(include_password=True)
    monkeypatch.setattr(celery_app.conf, "broker_read_url", read_url)
    monkeypatch.setattr(gather_module, "_brokers", {})
    # Long enough that a loaded box cannot end it before the paused gather below; it is shortened after that.
    monkeypatch.setattr(gather_module, "_SLOW_COUNT_PAUSE_SECONDS", 60.0)
    try:
        own, *waiting = _singles(4)
        _publish_each(waiting)
        wait_for(lambda: queue_depth(QUEUE) == 3)
        paused = partial(REGISTRY.get_sample_value, "notifier_send_gather_paused_total", {"queue": QUEUE})
        paused_before = paused() or 0.0
        relay.delay = 2 * gather_module._SLOW_COUNT_SECONDS
        slow = gather(QUEUE, [own])
        assert sorted(slow.ids) == sorted([own, *waiting])  # slow, yet counted and taken
        assert paused() == paused_before + 1  # operators see the pause
        slow.requeue()
        relay.delay = 0.0
        wait_for(lambda: queue_depth(QUEUE) == 3)
        # Paused: the next batch takes nothing, though three messages wait for it.
        assert gather(QUEUE, [own]) == Gathered(ids=[own])
        assert queue_depth(QUEUE) == 3
        # Once the pause is over the queue is counted again, and a quick count leaves it unpaused.
        queue_broker = gather_module._broker_for(QUEUE)
        assert queue_broker.paused_until > time.monotonic() + 50  # the pause's full length, from the slow count
        queue_broker.paused_until = time.monotonic() + 0.2
        wait_for(lambda: time.monotonic() > queue_broker.paused_until, timeout=5)
        again = gather(QUEUE, [own])
        assert sorted(again.ids) == sorted([own, *waiting])
        again.requeue()
        assert gather_module._broker_for(QUEUE).paused_until < time.monotonic()
        assert paused() == paused_before + 1
    finally:
        for queue_broker in gather_module._brokers.values():
            with queue_broker.lock:
                queue_broker.drop()
        relay.stop()


@pytest.mark.django_db(transaction=True)
def test_a_message_that_is_not_a_send_batch_is_left_to_the_consumer(empty_queues: None) -> None:
    celery_app.send_task("notifier.tasks.outbox_relay", queue=QUEUE)
    wait_for(lambda: queue_depth(QUEUE) == 1)
    batch = gather(QUEUE, [1])
    assert batch == Gathered(ids=[1])
    wait_for(lambda: queue_depth(QUEUE) == 1)


@pytest.mark.django_db(transaction=True)
def test_singles_claimed_together_with_one_poisoned_it_fails_alone(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str]
) -> None:
    """A burst of singles, one of them poisoned (its client's webhook secret makes the adapter raise).

    They wait on the queue before the worker starts, so the first task finds them there: it claims them with its
    own in one statement, sends them as one batch and fails only the poisoned one; every other is sent once.
    """
    webhook_template()
    address = f"{receiver.url}/hooks"
    good = _singles(15, address=address)
    [poison] = make_batch(n=1, address=address, client=poison_client())
    # Behind the first few (which a worker's prefetch takes), so the poisoned one travels in a gathered batch.
    singles = [*good[:8], poison, *good[8:]]
    _publish_each(singles)
    wait_for(lambda: queue_depth(QUEUE) == len(singles))

    start_worker(queues=[QUEUE], env=_worker_env(webhook_env), concurrency=1, pool="threads")
    wait_for(lambda: statuses(good)["sent"] == 15 and statuses([poison])["failed"] == 1, timeout=60)

    poisoned = Delivery.objects.get(pk=poison)
    assert poisoned.reason.startswith("error:") and poisoned.attempts == 1
    assert DeadLetter.objects.get(delivery_id=poison).reason == "poison"
    assert poison not in {h.delivery_id for h in receiver.snapshot()}
    claims = _claims(singles)
    # Fewer claims than singles: they travelled in batches, not one by one.
    assert len(set(claims.values())) < len(singles) / 2, Counter(claims.values())
    # The poisoned one was claimed together with good ones, and they were sent all the same.
    together = [i for i in good if claims[i] == claims[poison]]
    assert together, "the poisoned single was claimed alone"
    assert statuses(together)["sent"] == len(together)
    # Each sent exactly once; nothing dead-lettered, nothing left on the queue.
    assert receiver.ok_per_delivery() == {i: 1 for i in good}
    assert not DeadLetter.objects.filter(delivery_id__in=good).exists()
    assert queue_depth(QUEUE) == 0


@pytest.mark.django_db(transaction=True)
def test_singles_started_while_a_batch_of_their_queue_is_in_flight_are_sent_as_one_with_one_poisoned(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str]
) -> None:
    """A worker's threads combine the small send tasks that start while a batch of their queue is in flight.

    The first single's provider call is held open. The singles published meanwhile are taken by the worker's own
    consumer (its prefetch), so no gather on the queue can see them: each starts on a thread of its own and
    waits. Once the call is let go, the next of them sends all of them as one batch (one claim); the poisoned
    one fails alone and every other is sent once.
    """
    webhook_template()
    address = f"{receiver.url}/hooks"
    [first] = _singles(1, address=address)
    good = _singles(6, address=address)
    [poison] = make_batch(n=1, address=address, client=poison_client())
    held, release = _hold_answer(receiver, first)
    # Combining alone: the tasks wait for the held batch however long it is held (the bound has a test below).
    env = _worker_env(webhook_env, SEND_COMBINE_MAX_WAIT_SECONDS="60")
    start_worker(queues=[QUEUE], env=env, concurrency=8, pool="threads")
    try:
        _publish_each([first])
        wait_for(held.is_set, timeout=30)
        later = [*good[:3], poison, *good[3:]]
        _publish_each(later)
        wait_for(lambda: queue_depth(QUEUE) == 0)  # in the worker's prefetch, not on the queue
        time.sleep(1.0)  # its threads start their tasks and wait behind the held batch
    finally:
        release.set()
    wait_for(lambda: statuses([first, *good])["sent"] == 7 and statuses([poison])["failed"] == 1, timeout=60)

    claims = _claims(later)
    # Without combining, each of the seven is claimed by its own thread, at its own time (seven claims). One that
    # a slow box started only after the release goes in a batch of its own: at most three.
    assert len(set(claims.values())) <= 3, Counter(claims.values())
    together = [i for i in good if claims[i] == claims[poison]]
    assert together, "the poisoned single was claimed alone"
    assert statuses(together)["sent"] == len(together)
    poisoned = Delivery.objects.get(pk=poison)
    assert poisoned.reason.startswith("error:") and poisoned.attempts == 1
    assert DeadLetter.objects.get(delivery_id=poison).reason == "poison"
    assert receiver.ok_per_delivery() == {i: 1 for i in [first, *good]}
    assert not DeadLetter.objects.filter(delivery_id__in=[first, *good]).exists()


@pytest.mark.django_db(transaction=True)
def test_a_receiver_that_hangs_holds_back_only_its_own_delivery(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str]
) -> None:
    """One receiver hangs on its delivery; the singles of the same queue started behind its batch are still sent.

    They wait SEND_COMBINE_MAX_WAIT_SECONDS behind the held batch, then go beside it, combined among themselves:
    every one is sent while the hung call is still open, each once.
    """
    webhook_template()
    address = f"{receiver.url}/hooks"
    [hung] = _singles(1, address=address)
    behind = _singles(6, address=address)
    held, release = _hold_answer(receiver, hung)
    # The read timeout and the call deadline raised: the hung call stays open until the test lets it go.
    env = _worker_env(
        webhook_env,
        SEND_COMBINE_MAX_WAIT_SECONDS="0.3",
        PROVIDER_CALL_DEADLINE_SECONDS="120",
        WEBHOOK_READ_TIMEOUT_SECONDS="120",
    )
    start_worker(queues=[QUEUE], env=env, concurrency=8, pool="threads")
    try:
        _publish_each([hung])
        wait_for(held.is_set, timeout=30)
        _publish_each(behind)
        wait_for(lambda: statuses(behind)["sent"] == 6, timeout=30)
        # Still hanging: no answer yet, nothing written for it but its claim.
        assert not release.is_set() and hung not in receiver.ok_per_delivery()
        assert statuses([hung]) == {"sending": 1} and list(_claims([hung])) == [hung]
    finally:
        release.set()
    wait_for(lambda: statuses([hung])["sent"] == 1, timeout=60)
    assert receiver.ok_per_delivery() == {i: 1 for i in [hung, *behind]}
    # Beside the held batch they still travelled together, not each on its own.
    assert len(set(_claims(behind).values())) < len(behind), Counter(_claims(behind).values())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("threads", [1, 8], ids=["gathered", "combined"])
def test_a_gathered_batch_that_cannot_reach_the_database_retries_every_id(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str], threads: int
) -> None:
    """The worker's database is cut while singles wait; once it is back every single is sent, once.

    With one thread the first task gathers the others from the queue; with eight the worker's consumer takes
    them and its threads combine them: the retry of the batch carries the ids of every task that joined it.
    """
    db = settings.DATABASES["default"]
    webhook_template()
    singles = _singles(12, address=f"{receiver.url}/hooks")
    _publish_each(singles)
    tcp = TcpRelay(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)).start()
    try:
        url = f"postgres://{db['USER']}@127.0.0.1:{tcp.port}/{db['TEST']['NAME']}"
        env = _worker_env(webhook_env, DATABASE_URL=url)
        tcp.cut()
        worker = start_worker(queues=[QUEUE], env=env, concurrency=threads, pool="threads")
        wait_for(lambda: re.search(r"send_deliveries\[[0-9a-f-]+\] retry: Retry in", worker.log()), timeout=60)
        assert statuses(singles) == {"queued": 12}
        tcp.restore()
        wait_for(lambda: statuses(singles) == {"sent": 12}, timeout=90, interval=0.5)
    finally:
        tcp.stop()
    assert receiver.ok_per_delivery() == {i: 1 for i in singles}
    assert not DeadLetter.objects.filter(delivery_id__in=singles).exists()
