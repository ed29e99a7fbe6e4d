"""Topic fan-out: keyset pages, bulk compliance, exactly one delivery per target, published, resumable."""

from __future__ import annotations

import json
import signal
from collections import Counter
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

import pytest
from django.db import connection
from django.utils import timezone

from channels_app.models import SandboxMessage
from config.celery import app as celery_app
from notifier.accepting.services import notification_accept, notification_cancel
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery, DeliveryEvent, Notification
from notifier.dispatch import fanout
from notifier.dispatch.models import FanoutLane
from preferences.models import Recipient, Topic
from templates_app.services import template_put
from tests import factories
from tests.conftest import purge_all_queues, queue_depth, wait_for
from tests.factories import make_device, make_suppression

if TYPE_CHECKING:
    from amqp.channel import Channel as AmqpChannel

CONTENT = {
    "en": {
        "email": {"subject": "Sale {{ pct }}%", "text": "Spring sale: {{ pct }}% off"},
        "push": {"title": "Sale", "body": "{{ pct }}% off"},
        "sms": {"text": "Sale {{ pct }}%"},
    }
}


def make_template(key: str = "spring_sale", category: str = "marketing") -> None:
    template_put(key=key, category=category, default_locale="en", content=CONTENT)


def make_topic(key: str, n: int, *, prefix: str = "t") -> Topic:
    """Create a topic with `n` subscribers (with email and phone) in two set-based statements."""
    topic = factories.make_topic(key=key, name=key)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO preferences_recipient (user_id, email, phone, locale, timezone, webhook_url, opted_out, "
            "channel_prefs, category_prefs, created_at, updated_at) "
            "SELECT %s || g, %s || g || '@example.com', '+1555' || lpad(g::text, 7, '0'), '', '', '', false, "
            "'{}', '{}', now(), now() FROM generate_series(1, %s) g ON CONFLICT (environment_id, user_id) DO NOTHING",
            [f"{prefix}-", f"{prefix}-", n],
        )
        cursor.execute(
            "INSERT INTO preferences_subscription (topic_id, recipient_id, created_at) "
            "SELECT %s, id, now() FROM preferences_recipient WHERE user_id LIKE %s ORDER BY id",
            [topic.pk, f"{prefix}-%"],
        )
    return topic


def make_client() -> ApiClient:
    return api_client_create(name=f"svc-{timezone.now().timestamp()}")[0]


def accept_topic(client: ApiClient, topic: str, channels: list[str], **extra: Any) -> Notification:
    data: dict[str, Any] = {"topic": topic, "category": "marketing", "template": "spring_sale", "channels": channels}
    data["payload"] = {"pct": 20}
    return notification_accept(client=client, data={**data, **extra}).notification


def drain_ids(queue: str) -> list[int]:
    """Consume every ready message of a queue and return the delivery ids they carry (in order)."""
    ids: list[int] = []
    with celery_app.connection_for_write() as conn:
        channel = cast("AmqpChannel", conn.channel())  # py-amqp's: it has basic_get
        while True:
            message = channel.basic_get(queue, no_ack=True)
            if message is None:
                return ids
            args = json.loads(message.body)[0]
            ids.extend(args[0])


def run_to_end(notification: Notification) -> list[fanout.RunResult]:
    results = []
    for _ in range(1000):
        result = fanout.fanout_run(notification_id=notification.pk, enqueue_next=False)
        results.append(result)
        if result.done or result.stopped:
            return results
    raise AssertionError("fan-out did not finish")


@pytest.fixture
def clean_queues() -> None:
    purge_all_queues()


@pytest.mark.django_db(transaction=True)
def test_fanout_writes_each_target_once_with_compliance_and_publishes_every_queued_one(
    settings: Any, clean_queues: None
) -> None:
    settings.FANOUT_PAGE_SIZE = 7
    make_template()
    topic = make_topic("news", 30)
    recipients = list(Recipient.objects.filter(user_id__startswith="t-").order_by("id"))
    opted_out, no_email, suppressed, two_devices = recipients[0], recipients[1], recipients[2], recipients[3]
    Recipient.objects.filter(pk=opted_out.pk).update(opted_out=True)
    Recipient.objects.filter(pk=no_email.pk).update(email="")
    make_suppression(channel="email", address=suppressed.email, reason="bounce", source="bounce")
    make_device(recipient=two_devices, token="tok-a")
    make_device(recipient=two_devices, token="tok-b")
    make_device(recipient=two_devices, token="tok-dead", active=False)
    client = make_client()

    notification = accept_topic(client, topic.key, ["email", "push"])
    results = run_to_end(notification)

    notification.refresh_from_db()
    assert notification.status == Notification.Status.DONE
    assert notification.recipients_total == 30 == notification.fanout_processed
    assert sum(r.pages for r in results) == 5  # 30 subscribers, 7 a page
    deliveries = list(Delivery.objects.filter(notification=notification))
    # email for everyone; push: two devices for one recipient, a no_address row for each of the others
    assert len(deliveries) == 30 + 29 + 2
    assert not [k for k, v in Counter((d.recipient_id, d.channel, d.address) for d in deliveries).items() if v > 1]
    by_key = {(d.recipient_id, d.channel, d.address): d for d in deliveries}
    assert by_key[(opted_out.pk, "email", opted_out.email)].reason == "opted_out"
    assert by_key[(no_email.pk, "email", "")].reason == "no_address"
    assert by_key[(suppressed.pk, "email", suppressed.email)].reason == "suppressed"
    assert {by_key[(two_devices.pk, "push", t)].status for t in ("tok-a", "tok-b")} == {"queued"}
    queued = {d.pk for d in deliveries if d.status == "queued"}
    assert len(queued) == 27 + 2
    assert all(d.published_at is not None for d in deliveries if d.status == "queued")
    assert all(d.published_at is None for d in deliveries if d.status != "queued")
    assert all(d.priority == "low" for d in deliveries)
    events = Counter(DeliveryEvent.objects.filter(delivery__notification=notification).values_list("status", flat=True))
    assert events == Counter({"queued": len(queued), "suppressed": len(deliveries) - len(queued)})
    published = drain_ids("email.low") + drain_ids("push.low")
    assert sorted(published) == sorted(queued)


@pytest.mark.django_db(transaction=True)
def test_a_page_redone_after_a_crash_inserts_nothing_twice_and_republishes_what_waits(
    settings: Any, clean_queues: None
) -> None:
    settings.FANOUT_PAGE_SIZE = 10
    make_template()
    topic = make_topic("crashy", 25)
    notification = accept_topic(make_client(), topic.key, ["email"])
    first = fanout.fanout_page(notification_id=notification.pk)
    assert first.subscribers == first.inserted == first.published == 10
    page_ids = sorted(Delivery.objects.filter(notification=notification).values_list("id", flat=True))
    # One of them was sent meanwhile; then the crash: the checkpoint and the publish are lost.
    Delivery.objects.filter(pk=page_ids[0]).update(status="sent")
    FanoutLane.objects.filter(notification=notification).update(cursor=0, processed=0)
    Notification.objects.filter(pk=notification.pk).update(fanout_processed=0)
    purge_all_queues()

    redo = fanout.fanout_page(notification_id=notification.pk)

    assert redo.subscribers == 10 and redo.inserted == 0
    assert sorted(drain_ids("email.low")) == page_ids[1:]
    assert Delivery.objects.filter(notification=notification).count() == 10
    assert DeliveryEvent.objects.filter(delivery__notification=notification).count() == 10
    run_to_end(notification)
    notification.refresh_from_db()
    assert notification.recipients_total == 25
    assert Delivery.objects.filter(notification=notification).count() == 25


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_notification_stops_fanning_out(settings: Any, clean_queues: None) -> None:
    settings.FANOUT_PAGE_SIZE = 10
    make_template()
    topic = make_topic("stopme", 40)
    notification = accept_topic(make_client(), topic.key, ["email"])
    fanout.fanout_page(notification_id=notification.pk)
    assert notification_cancel(notification=notification) == 10

    result = fanout.fanout_run(notification_id=notification.pk, enqueue_next=False)

    assert result.stopped == "cancelled" and result.subscribers == 0
    assert Delivery.objects.filter(notification=notification).count() == 10
    assert set(Delivery.objects.filter(notification=notification).values_list("status", flat=True)) == {"cancelled"}


@pytest.mark.django_db(transaction=True)
def test_a_run_re_enqueues_itself_on_the_fanout_queue(settings: Any, clean_queues: None) -> None:
    settings.FANOUT_PAGE_SIZE = 5
    settings.FANOUT_RUN_SECONDS = 0  # one page per run
    make_template()
    topic = make_topic("chain", 12)
    notification = accept_topic(make_client(), topic.key, ["email"])
    purge_all_queues()  # the accept's own fan-out message

    result = fanout.fanout_run(notification_id=notification.pk)

    assert result.pages == 1 and result.next_in == 0.0
    assert queue_depth("fanout") == 1
    notification.refresh_from_db()
    assert FanoutLane.objects.get(notification=notification, lane=0).cursor > 0
    assert notification.fanout_processed == 5


@pytest.mark.django_db(transaction=True)
def test_the_sweeper_resumes_a_stalled_fanout_only(settings: Any, clean_queues: None) -> None:
    make_template()
    topic = make_topic("stalled", 3)
    client = make_client()
    stalled = accept_topic(client, topic.key, ["email"])
    accept_topic(client, topic.key, ["email"], dedup_key="fresh")
    later = accept_topic(client, topic.key, ["email"], dedup_key="later", send_at=timezone.now() + timedelta(hours=1))
    old = timezone.now() - timedelta(hours=1)
    Notification.objects.filter(pk__in=[stalled.pk, later.pk]).update(updated_at=old)
    purge_all_queues()

    assert fanout.fanout_sweep() == 1

    assert queue_depth("fanout") == 1
    assert drain_ids_raw("fanout") == [str(stalled.pk)]


def drain_ids_raw(queue: str) -> list[str]:
    """Consume the fan-out messages of a queue and return the notification ids they carry."""
    return [args[0] for args in drain_args(queue)]


def drain_args(queue: str) -> list[list[Any]]:
    """Consume the fan-out messages of a queue and return their task arguments."""
    out: list[list[Any]] = []
    with celery_app.connection_for_write() as conn:
        channel = cast("AmqpChannel", conn.channel())  # py-amqp's: it has basic_get
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            out.append(json.loads(message.body)[0])
    return out


@pytest.mark.django_db(transaction=True)
def test_a_large_topic_is_split_into_lanes_that_each_cover_their_range_once(settings: Any, clean_queues: None) -> None:
    settings.FANOUT_PAGE_SIZE = 7
    settings.FANOUT_LANES = 3
    settings.FANOUT_LANE_MIN_SUBSCRIBERS = 20
    make_template()
    topic = make_topic("laned", 50)
    notification = accept_topic(make_client(), topic.key, ["email"])
    purge_all_queues()  # the accept's own fan-out message (lane 0)

    first = fanout.fanout_page(notification_id=notification.pk)

    lanes = list(FanoutLane.objects.filter(notification=notification).order_by("lane"))
    assert [lane.lane for lane in lanes] == [0, 1, 2]
    upper0, upper1 = lanes[0].upper, lanes[1].upper
    assert lanes[-1].upper is None and upper0 is not None and upper1 is not None and upper0 < upper1
    assert [lane.cursor for lane in lanes[1:]] == [lanes[0].upper, lanes[1].upper]
    # Lanes 1 and 2 were started next to this run; lane 0 did its first page.
    assert sorted(drain_args("fanout")) == sorted([[str(notification.pk), 1], [str(notification.pk), 2]])
    assert first.subscribers == 7
    for lane in (2, 0):  # lane 1 last: the notification is done only when every lane is
        while not fanout.fanout_run(notification_id=notification.pk, lane=lane, enqueue_next=False).stopped:
            pass
        notification.refresh_from_db()
        assert notification.status == Notification.Status.FANNING_OUT
    assert fanout.fanout_run(notification_id=notification.pk, lane=1, enqueue_next=False).done
    notification.refresh_from_db()
    assert notification.status == Notification.Status.DONE and notification.recipients_total == 50
    processed = {lane.lane: lane.processed for lane in FanoutLane.objects.filter(notification=notification)}
    assert processed == {0: 16, 1: 17, 2: 17}
    per_recipient = Counter(Delivery.objects.filter(notification=notification).values_list("recipient_id", flat=True))
    assert len(per_recipient) == 50 and set(per_recipient.values()) == {1}


@pytest.mark.django_db(transaction=True)
def test_the_sweeper_resumes_a_stalled_lane(settings: Any, clean_queues: None) -> None:
    settings.FANOUT_LANES = 2
    settings.FANOUT_LANE_MIN_SUBSCRIBERS = 4
    make_template()
    topic = make_topic("stalled-lane", 10)
    notification = accept_topic(make_client(), topic.key, ["email"])
    fanout.fanout_page(notification_id=notification.pk)  # splits; lane 1's message is lost below
    purge_all_queues()
    old = timezone.now() - timedelta(hours=1)
    FanoutLane.objects.filter(notification=notification, lane=1).update(updated_at=old)

    assert fanout.fanout_sweep() == 1

    assert drain_args("fanout") == [[str(notification.pk), 1]]


@pytest.mark.django_db(transaction=True)
def test_resuming_enqueues_every_unfinished_lane_or_lane_0_before_the_split(settings: Any, clean_queues: None) -> None:
    settings.FANOUT_LANES = 3
    settings.FANOUT_LANE_MIN_SUBSCRIBERS = 6
    make_template()
    topic = make_topic("resumable", 9)
    client = make_client()
    unsplit = accept_topic(client, topic.key, ["email"])
    split = accept_topic(client, topic.key, ["email"], dedup_key="split")
    fanout.fanout_page(notification_id=split.pk)
    FanoutLane.objects.filter(notification=split, lane=2).update(done=True)
    purge_all_queues()

    assert fanout.enqueue_unfinished(unsplit.pk) == 1
    assert fanout.enqueue_unfinished(split.pk) == 2

    expected: list[list[Any]] = [[str(unsplit.pk)], [str(split.pk)], [str(split.pk), 1]]
    assert sorted(drain_args("fanout")) == sorted(expected)


@pytest.mark.django_db(transaction=True)
def test_killed_fanout_worker_resumes_from_its_checkpoint(start_worker: Any) -> None:
    """SIGKILL the fan-out worker mid-way: every subscriber gets exactly one delivery, and every one is sent."""
    total = 20_000
    make_template()
    topic = make_topic("big", total)
    client = make_client()
    # Two lanes on two processes: the kill interrupts both checkpoints.
    env = {
        "FANOUT_PAGE_SIZE": "100",
        "FANOUT_RUN_SECONDS": "1",
        "FANOUT_LANES": "2",
        "FANOUT_LANE_MIN_SUBSCRIBERS": "1",
    }
    first = start_worker(queues=["fanout"], env=env, concurrency=2)

    notification = accept_topic(client, topic.key, ["email"])

    def processed() -> int:
        return Notification.objects.filter(pk=notification.pk).values_list("fanout_processed", flat=True).first() or 0

    wait_for(lambda: processed() >= 2_000, timeout=60, interval=0.02)
    first.kill(signal.SIGKILL)
    first.proc.wait(timeout=10)
    at_kill = processed()
    assert 0 < at_kill < total, "the worker must die mid-way for this test to mean anything"

    start_worker(queues=["fanout"], env=env, concurrency=2)
    wait_for(lambda: Notification.objects.filter(pk=notification.pk, status="done").exists(), timeout=120, interval=0.5)
    assert FanoutLane.objects.filter(notification=notification, done=True).count() == 2
    notification.refresh_from_db()
    assert notification.recipients_total == total
    per_recipient = Counter(Delivery.objects.filter(notification=notification).values_list("recipient_id", flat=True))
    assert len(per_recipient) == total and set(per_recipient.values()) == {1}
    assert not Delivery.objects.filter(notification=notification, status="queued", published_at__isnull=True).exists()

    start_worker(queues=["email.low"], concurrency=2)
    wait_for(lambda: SandboxMessage.objects.count() >= total, timeout=240, interval=1)
    wait_for(lambda: Delivery.objects.filter(notification=notification, status="sent").count() == total, timeout=60)
    assert SandboxMessage.objects.count() == total
