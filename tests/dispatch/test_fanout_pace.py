"""The pace of high-priority fan-out: what a topic puts into `<channel>.high` per second is bounded, shared.

Measured from the broker: the ids ready in a high queue right after a run (what arrived in the first second
window) and the `eta` Celery stamps on every delayed message (the second it was published for).
"""

from __future__ import annotations

import json
import math
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from config.celery import app as celery_app
from notifier.accepting.services import notification_accept
from notifier.deliveries.models import Delivery, Notification
from notifier.dispatch import fanout, pace
from templates_app.services import template_put
from tests.conftest import purge_all_queues, wait_for
from tests.dispatch.test_fanout import make_client, make_topic

if TYPE_CHECKING:
    from amqp.channel import Channel as AmqpChannel

CONTENT = {
    "en": {
        "email": {"subject": "Your order {{ n }}", "text": "Order {{ n }}"},
        "inapp": {"title": "Order", "body": "Order {{ n }}"},
    }
}


def accept(topic: str, channels: list[str], *, category: str = "transactional", priority: str = "high") -> Notification:
    template_put(key=f"t_{category}", category=category, default_locale="en", content=CONTENT)
    data: dict[str, Any] = {"topic": topic, "template": f"t_{category}", "channels": channels, "payload": {"n": 1}}
    if priority:
        data["priority"] = priority
    return notification_accept(client=make_client(), data=data).notification


def drain(queue: str) -> list[tuple[float | None, list[int]]]:
    """Consume every ready message of a queue: (its eta as a timestamp, or None for no countdown; its ids)."""
    out: list[tuple[float | None, list[int]]] = []
    with celery_app.connection_for_write() as conn:
        channel = cast("AmqpChannel", conn.channel())  # py-amqp's: it has basic_get
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            eta = (message.headers or {}).get("eta")
            out.append((datetime.fromisoformat(eta).timestamp() if eta else None, json.loads(message.body)[0][0]))
    return out


def ids_of(messages: list[tuple[float | None, list[int]]]) -> list[int]:
    return [i for _, ids in messages for i in ids]


@pytest.fixture
def clean_broker() -> None:
    purge_all_queues()


@pytest.mark.django_db(transaction=True)
def test_a_high_priority_topic_enters_the_high_queue_no_faster_than_the_pace(settings: Any, clean_broker: None) -> None:
    settings.FANOUT_HIGH_PACE = "*=40"
    settings.FANOUT_PACE_WINDOW_SECONDS = 2
    make_topic("everyone", 200)
    n = accept("everyone", ["email"])
    started = math.floor(time.time())
    first = fanout.fanout_run(notification_id=n.pk, enqueue_next=False)
    first_window = drain("email.high")
    # The first second's window holds at most the pace; the rest waits in the broker's delayed delivery.
    assert 0 < len(ids_of(first_window)) <= 40
    assert all(eta is None for eta, _ in first_window)
    # Deliveries are written no further than about a pace window ahead: 200 subscribers are not one page.
    assert first.subscribers < 200 and first.next_in is not None and first.next_in > 0

    seen = list(first_window)
    for _ in range(100):
        result = fanout.fanout_run(notification_id=n.pk, enqueue_next=False)
        if result.done:
            break
        seen += drain("email.high")
        time.sleep(min(result.next_in or 0.2, 3))
    assert result.done

    def arrived() -> bool:
        seen.extend(drain("email.high"))
        return len(ids_of(seen)) >= 200

    wait_for(arrived, timeout=60, interval=0.5)
    all_ids = ids_of(seen)
    assert len(all_ids) == len(set(all_ids)) == 200
    # By its publish time (the eta Celery stamps on a countdown), no window of k seconds from the start got
    # more than the pace's k seconds plus the first second's worth.
    etas = sorted((eta or started, len(ids)) for eta, ids in seen)
    total = 0
    for eta, count in etas:
        total += count
        assert total <= 40 * (math.floor(eta) - started + 1) + 40, (eta - started, total)
    assert math.floor(etas[-1][0]) - started >= 200 // 40 - 2  # spread over the seconds, not sent at once


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("direct", [False, True], ids=["through-worker", "stored-at-fanout"])
def test_the_pace_is_per_channel_and_in_app_is_not_held_back(settings: Any, clean_broker: None, direct: bool) -> None:
    settings.FANOUT_HIGH_PACE = "*=100;inapp=10000"
    settings.FANOUT_INAPP_DIRECT = direct
    make_topic("members", 300)
    n = accept("members", ["email", "inapp"])
    fanout.fanout_run(notification_id=n.pk, enqueue_next=False)
    published = ids_of(drain("inapp.high"))
    stored = Delivery.objects.filter(notification=n, channel="inapp", status="sent").count()
    # Every in-app delivery at once: published (through the worker) or already in the inboxes (stored at fan-out).
    assert (len(published), stored) == ((0, 300) if direct else (300, 0))
    assert 0 < len(ids_of(drain("email.high"))) <= 100


@pytest.mark.django_db(transaction=True)
def test_the_default_pace_keeps_in_app_fast_and_paces_email(clean_broker: None) -> None:
    assert pace.pace_for("inapp") == 10_000 and pace.pace_for("email") == 500 and pace.pace_for("sms") == 500


@pytest.mark.django_db(transaction=True)
def test_two_topics_share_one_pace(settings: Any, clean_broker: None) -> None:
    settings.FANOUT_HIGH_PACE = "*=50"
    make_topic("a", 120, prefix="a")
    make_topic("b", 120, prefix="b")
    first, second = accept("a", ["email"]), accept("b", ["email"])
    fanout.fanout_run(notification_id=first.pk, enqueue_next=False)
    fanout.fanout_run(notification_id=second.pk, enqueue_next=False)
    ready = drain("email.high")
    # Both fan-outs together got one second's worth: the pace lives in Redis, not in either run.
    assert 0 < len(ids_of(ready)) <= 50


@pytest.mark.django_db(transaction=True)
def test_low_priority_topics_are_not_paced(settings: Any, clean_broker: None) -> None:
    settings.FANOUT_HIGH_PACE = "*=10"
    make_topic("news", 150)
    n = accept("news", ["email"], category="marketing", priority="")
    fanout.fanout_run(notification_id=n.pk, enqueue_next=False)
    assert len(ids_of(drain("email.low"))) == 150


def test_reservations_fill_second_by_second_and_fall_back_without_redis(settings: Any) -> None:
    settings.FANOUT_HIGH_PACE = "sms=10"
    redis_now = pace._guard.client().time
    for _ in range(5):  # offsets are from Redis' current second: redo a run that straddled a second boundary
        pace.reset(["sms"])
        before = redis_now()[0]
        got = [pace.reserve("sms", 25), pace.reserve("sms", 6), pace.seconds_ahead(["sms"])]
        got += [pace.reserve("push", 7), pace.reserve("sms", 3, earliest=9.5)]
        if redis_now()[0] == before:
            break
    assert got[0] == [(0, 10), (1, 10), (2, 5)]  # fill a second up to the pace, then the next
    assert got[1] == [(2, 5), (3, 1)]  # shared: the next reservation goes on where the last one stopped
    assert got[2] == 4
    assert got[3] == [(0, 7)]  # not in the setting, no "*": unpaced
    assert got[4] == [(10, 3)]  # a campaign's part never earlier than its cap allows

    import redis

    from core.redis_guard import RedisGuard

    original = pace._guard
    pace._guard = RedisGuard("fan-out pace", redis.Redis(port=1, socket_connect_timeout=0.2))
    settings.RESILIENCE_ASSUMED_WORKERS = 2
    try:
        # This process's share of the pace (10 / 2 workers) while Redis is away.
        assert pace.reserve("sms", 12) == [(0, 5), (1, 5), (2, 2)]
    finally:
        pace._guard = original
        pace.reset(["sms"])


@pytest.mark.pure
def test_a_malformed_pace_is_refused_at_start(settings: Any) -> None:
    settings.FANOUT_HIGH_PACE = "email=fast"
    with pytest.raises(SystemCheckError, match="FANOUT_HIGH_PACE"):
        call_command("check")
    with pytest.raises(ValueError, match="email=fast"):
        pace.parse_pace("email=fast")
