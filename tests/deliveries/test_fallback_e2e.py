"""Fallback between channels end to end: real API, PostgreSQL, RabbitMQ (delayed delivery) and Celery workers."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from channels_app.models import SandboxMessage
from notifier.deliveries.models import Delivery, DeliveryEvent
from notifier.deliveries.status import transition
from preferences.services import device_add, recipient_upsert, topic_subscribe, topic_upsert
from templates_app.services import template_put
from tests.conftest import wait_for

CONTENT = {
    "en": {
        "push": {"title": "Alert", "body": "Something happened"},
        "sms": {"text": "Something happened"},
        "email": {"subject": "Alert", "text": "Something happened"},
    }
}
QUEUES = ["push.high", "sms.high", "email.high", "maintenance", "fanout"]


@pytest.fixture
def setup(db: None) -> None:
    template_put(key="alert", category="transactional", default_locale="en", content=CONTENT)
    recipient, _ = recipient_upsert(user_id="fb-1", phone="+15005550006", email="fb-1@example.com")
    device_add(recipient=recipient, platform="android", token="tok-fb-1")
    recipient_upsert(user_id="fb-nodevice", phone="+15005550007")


def _send(api: Any, user_id: str = "fb-1", **extra: Any) -> dict[str, Any]:
    body = {
        "recipient": {"user_id": user_id},
        "template": "alert",
        "category": "transactional",
        "channels": ["push", "sms"],
        "strategy": "fallback",
        **extra,
    }
    response = api.post("/api/v1/notifications", body, format="json")
    assert response.status_code == 202, response.content
    return response.json()


def _delivery(notification_id: str, channel: str) -> Delivery:
    return Delivery.objects.get(notification_id=notification_id, channel=channel)


def _events(delivery: Delivery) -> list[tuple[str, str]]:
    return list(DeliveryEvent.objects.filter(delivery=delivery).order_by("id").values_list("status", "detail"))


def _sms_sent(notification_id: str) -> Delivery | None:
    return Delivery.objects.filter(notification_id=notification_id, channel="sms", status="sent").first()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_sms_follows_when_push_fails(api: Any, start_worker: Any) -> None:
    start_worker(queues=QUEUES, env={"SANDBOX_BEHAVIOUR": "push=permanent"})
    body = _send(api, fallback_until="delivered", fallback_after_seconds=600)
    assert {d["channel"]: d["status"] for d in body["deliveries"]} == {"push": "queued", "sms": "pending"}
    sms = wait_for(lambda: _sms_sent(body["id"]), 60)
    assert _delivery(body["id"], "push").status == "failed"
    statuses = _events(sms)
    assert statuses[0] == ("pending", "fallback")
    assert statuses[1][0] == "queued" and statuses[1][1].startswith("fallback: push failed")
    assert [s for s, _ in statuses[2:]] == ["sending", "sent"]
    assert SandboxMessage.objects.filter(delivery_id=sms.pk).count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_sms_starts_at_once_when_push_is_suppressed(api: Any, start_worker: Any) -> None:
    start_worker(queues=QUEUES)
    body = _send(api, user_id="fb-nodevice", fallback_after_seconds=600)
    by_channel = {d["channel"]: d for d in body["deliveries"]}
    assert (by_channel["push"]["status"], by_channel["push"]["reason"]) == ("suppressed", "no_address")
    assert by_channel["sms"]["status"] == "queued"
    sms = wait_for(lambda: _sms_sent(body["id"]), 60)
    assert ("queued", "fallback: push suppressed (no_address)") in _events(sms)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_sms_follows_when_push_is_not_opened_in_time(api: Any, start_worker: Any) -> None:
    start_worker(queues=QUEUES)
    started = time.monotonic()
    body = _send(api, fallback_until="opened", fallback_after_seconds=3)
    wait_for(lambda: _delivery(body["id"], "push").status == "sent", 30)
    assert _delivery(body["id"], "sms").status == "pending"
    sms = wait_for(lambda: _sms_sent(body["id"]), 60)
    assert time.monotonic() - started >= 3
    assert ("queued", "fallback: push not opened within 3s") in _events(sms)
    assert _delivery(body["id"], "push").status == "sent"  # it went out; it just was not opened


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_sms_is_skipped_when_push_is_sent_and_sent_is_enough(api: Any, start_worker: Any) -> None:
    start_worker(queues=QUEUES)
    body = _send(api, fallback_until="sent", fallback_after_seconds=2)
    wait_for(lambda: _delivery(body["id"], "sms").status == "skipped", 30)
    sms = _delivery(body["id"], "sms")
    assert _events(sms) == [("pending", "fallback"), ("skipped", "fallback: push reached sent")]
    time.sleep(4)  # past the deadline: the timer message finds nothing left to decide
    assert _delivery(body["id"], "sms").status == "skipped"
    assert not SandboxMessage.objects.filter(delivery_id=sms.pk).exists()
    detail = api.get(f"/api/v1/notifications/{body['id']}").json()
    assert detail["strategy"] == "fallback" and detail["fallback_until"] == "sent"
    assert {d["channel"]: d["status"] for d in detail["deliveries"]} == {"push": "sent", "sms": "skipped"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_restarting_every_worker_while_a_fallback_waits_changes_nothing(api: Any, start_worker: Any) -> None:
    """Two chains wait on a delivered receipt; every worker is killed; one receipt comes, the other never does."""
    first = start_worker(queues=QUEUES)
    timed_out = _send(api, fallback_until="delivered", fallback_after_seconds=8)
    answered = _send(api, fallback_until="delivered", fallback_after_seconds=8)
    wait_for(lambda: Delivery.objects.filter(channel="push", status="sent").count() == 2, 30)
    first.kill(signal.SIGKILL)
    first.proc.wait(timeout=10)
    # While no worker runs, the receipt for one push arrives (the callback path: a guarded transition).
    push = _delivery(answered["id"], "push")
    assert transition([push.pk], to="delivered", only_from=["sent"], detail="receipt") == [push.pk]
    assert _delivery(answered["id"], "sms").status == "skipped"
    start_worker(queues=QUEUES)
    sms = wait_for(lambda: _sms_sent(timed_out["id"]), 60)
    assert ("queued", "fallback: push not delivered within 8s") in _events(sms)
    time.sleep(2)
    assert SandboxMessage.objects.filter(delivery_id=sms.pk).count() == 1
    assert _delivery(answered["id"], "sms").status == "skipped"
    assert Delivery.objects.filter(channel="sms", status="sent").count() == 1
    # A late receipt for the chain the timer already decided changes nothing either.
    late = _delivery(timed_out["id"], "push")
    transition([late.pk], to="delivered", only_from=["sent"], detail="late receipt")
    assert _sms_sent(timed_out["id"]) is not None


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_topic_fallback_is_decided_per_recipient(api: Any, start_worker: Any) -> None:
    topic, _ = topic_upsert(key="ops", name="Ops")
    topic_subscribe(topic=topic, user_ids=["fb-1", "fb-nodevice"])
    start_worker(queues=QUEUES)
    body = {"topic": "ops", "template": "alert", "category": "transactional", "channels": ["push", "sms"]}
    response = api.post(
        "/api/v1/notifications", {**body, "strategy": "fallback", "fallback_until": "sent"}, format="json"
    )
    assert response.status_code == 202, response.content
    nid = response.json()["id"]
    wait_for(lambda: Delivery.objects.filter(notification_id=nid, status__in=["sent", "skipped"]).count() == 3, 60)
    rows = set(Delivery.objects.filter(notification_id=nid).values_list("recipient__user_id", "channel", "status"))
    assert rows == {
        ("fb-1", "push", "sent"),
        ("fb-1", "sms", "skipped"),
        ("fb-nodevice", "push", "suppressed"),
        ("fb-nodevice", "sms", "sent"),
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_batch_items_take_the_fallback_strategy(api: Any) -> None:
    item = {"recipient": {"user_id": "fb-1"}, "template": "alert", "category": "transactional"}
    response = api.post(
        "/api/v1/notifications/batch",
        {"notifications": [{**item, "strategy": "fallback", "channels": ["sms", "push", "email"]}, item]},
        format="json",
    )
    first, second = response.json()["results"]
    assert [(d["channel"], d["status"]) for d in first["deliveries"]] == [
        ("sms", "queued"),
        ("push", "pending"),
        ("email", "pending"),
    ]
    # Only the next step has a deadline; the one after it waits for the next decision.
    deadlines = dict(Delivery.objects.filter(notification_id=first["id"]).values_list("channel", "not_before"))
    assert deadlines["push"] is not None and deadlines["email"] is None and deadlines["sms"] is None
    assert {d["status"] for d in second["deliveries"]} == {"queued"}


@pytest.mark.django_db
@pytest.mark.usefixtures("setup")
@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"strategy": "cascade"}, "strategy"),
        ({"fallback_until": "sent"}, "fallback_until"),
        ({"strategy": "fallback", "fallback_until": "read"}, "fallback_until"),
        ({"strategy": "fallback", "fallback_after_seconds": 0}, "fallback_after_seconds"),
    ],
)
def test_bad_strategy_input_is_400_naming_the_field(api: Any, extra: dict[str, Any], field: str) -> None:
    body = {"recipient": {"user_id": "fb-1"}, "template": "alert", "category": "transactional", **extra}
    response = api.post("/api/v1/notifications", body, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
