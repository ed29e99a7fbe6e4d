"""End to end through the real API, PostgreSQL, RabbitMQ and a real Celery worker."""

from __future__ import annotations

from typing import Any

import pytest

from channels_app.models import SandboxMessage
from notifier.deadletters.models import DeadLetter
from notifier.deliveries.models import Delivery
from templates_app.services import template_put
from tests.conftest import queue_depth, wait_for

CONTENT = {
    "en": {
        "email": {"subject": "Order {{ order_id }}", "text": "Shipped {{ order_id }}", "html": "<p>{{ order_id }}</p>"},
        "sms": {"text": "Order {{ order_id }} shipped"},
        "inapp": {"title": "Shipped", "body": "Order {{ order_id }}"},
    }
}


def make_template(key: str = "order_shipped") -> None:
    template_put(key=key, category="transactional", default_locale="en", content=CONTENT)


def send(api: Any, user_id: str = "u-1", **extra: Any) -> Any:
    body = {
        "recipient": {"user_id": user_id},
        "category": "transactional",
        "template": "order_shipped",
        "payload": {"order_id": "A-1"},
        **extra,
    }
    return api.post("/api/v1/notifications", body, format="json")


def put_recipient(api: Any, user_id: str = "u-1") -> None:
    response = api.put(
        f"/api/v1/recipients/{user_id}", {"email": f"{user_id}@example.com", "phone": "+15005550006"}, format="json"
    )
    assert response.status_code in (200, 201), response.content


@pytest.mark.django_db(transaction=True)
def test_accepted_notification_is_delivered(api: Any, start_worker: Any) -> None:
    make_template()
    put_recipient(api)
    start_worker()
    response = send(api, channels=["email", "sms", "inapp"])
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["duplicate"] is False
    assert {d["channel"] for d in body["deliveries"]} == {"email", "sms", "inapp"}
    wait_for(lambda: SandboxMessage.objects.count() == 2)  # email + sms; in-app is stored on the delivery
    wait_for(lambda: Delivery.objects.filter(status="sent").count() == 3)
    detail = api.get(f"/api/v1/notifications/{body['id']}").json()
    email = next(d for d in detail["deliveries"] if d["channel"] == "email")
    assert email["provider"] == "sandbox"
    assert email["provider_message_id"] == f"sandbox-{email['id']}"
    assert [e["status"] for e in email["events"]] == ["queued", "sending", "sent"]
    recorded = SandboxMessage.objects.get(delivery_id=email["id"])
    assert recorded.content["subject"] == "Order A-1"
    assert recorded.address == "u-1@example.com"
    inapp = Delivery.objects.get(notification_id=body["id"], channel="inapp")
    assert inapp.content == {"title": "Shipped", "body": "Order A-1", "url": ""}


@pytest.mark.django_db(transaction=True)
def test_retriable_errors_are_retried_then_sent(api: Any, start_worker: Any, settings: Any) -> None:
    make_template()
    put_recipient(api)
    start_worker(env={"SANDBOX_BEHAVIOUR": "fail:2", "RETRY_BACKOFF_BASE_SECONDS": "0.5"})
    body = send(api, channels=["email"]).json()
    delivery = wait_for(lambda: Delivery.objects.filter(notification_id=body["id"], status="sent").first(), 60)
    assert delivery.attempts == 3
    statuses = list(delivery.events.order_by("id").values_list("status", flat=True))
    assert statuses == ["queued", "sending", "queued", "sending", "queued", "sending", "sent"]
    assert SandboxMessage.objects.filter(delivery_id=delivery.pk).count() == 1


@pytest.mark.django_db(transaction=True)
def test_permanent_error_fails_without_retry(api: Any, start_worker: Any) -> None:
    make_template()
    put_recipient(api)
    start_worker(env={"SANDBOX_BEHAVIOUR": "permanent"})
    body = send(api, channels=["sms"]).json()
    delivery = wait_for(lambda: Delivery.objects.filter(notification_id=body["id"], status="failed").first())
    assert delivery.attempts == 1
    assert "simulated rejection" in delivery.last_error
    assert not DeadLetter.objects.filter(delivery=delivery).exists()


@pytest.mark.django_db(transaction=True)
def test_exhausted_retries_are_dead_lettered(api: Any, start_worker: Any) -> None:
    make_template()
    put_recipient(api)
    before = queue_depth("dead.email")
    start_worker(env={"SANDBOX_BEHAVIOUR": "fail", "DELIVERY_MAX_ATTEMPTS": "3", "RETRY_BACKOFF_BASE_SECONDS": "0.5"})
    body = send(api, channels=["email"]).json()
    delivery = wait_for(lambda: Delivery.objects.filter(notification_id=body["id"], status="failed").first(), 60)
    assert delivery.attempts == 3
    assert delivery.reason == "attempts_exhausted"
    dead = DeadLetter.objects.get(delivery=delivery)
    assert dead.status == "pending" and dead.attempts == 3
    wait_for(lambda: queue_depth("dead.email") == before + 1)
    assert not SandboxMessage.objects.filter(delivery_id=delivery.pk).exists()
