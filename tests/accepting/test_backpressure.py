"""Shedding low-priority load with a 429 while the low queues are deep; high priority keeps flowing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from config.celery import app as celery_app
from notifier.accepting import backpressure
from notifier.deliveries.models import Notification
from templates_app.services import template_put
from tests.conftest import purge_all_queues, queue_depth

CONTENT = {"en": {"email": {"subject": "Hi", "text": "Hello"}}}


def fill(queue: str, n: int) -> None:
    """Publish `n` messages to a queue with no worker consuming it."""
    with celery_app.producer_or_acquire() as producer:
        for _ in range(n):
            celery_app.send_task("notifier.tasks.noop", queue=queue, producer=producer)


@pytest.fixture
def backlog(settings: Any) -> Iterator[None]:
    """Six messages waiting in email.low and sms.low, over a limit of five."""
    purge_all_queues()
    settings.BACKPRESSURE_LOW_QUEUE_DEPTH = 5
    settings.BACKPRESSURE_CACHE_SECONDS = 0
    backpressure.reset_cache()
    fill("email.low", 3)
    fill("sms.low", 3)
    fill("email.high", 50)  # the high queues never count
    assert queue_depth("email.low") == 3
    yield
    purge_all_queues()
    backpressure.reset_cache()


@pytest.fixture(autouse=True)
def templates(db: None) -> None:
    for key, category in (("otp", "security"), ("promo", "marketing"), ("likes", "social")):
        template_put(key=key, category=category, default_locale="en", content=CONTENT)


def send(api: Any, template: str, category: str, **extra: Any) -> Any:
    body = {"recipient": {"user_id": "u-1"}, "category": category, "template": template, **extra}
    return api.post("/api/v1/notifications", body, format="json")


def test_the_backlog_is_the_ready_messages_of_the_low_queues(backlog: None) -> None:
    assert backpressure.measure_low_backlog() == 6


def test_low_priority_is_shed_with_429_while_high_priority_flows(api: Any, backlog: None) -> None:
    shed = send(api, "promo", "marketing")
    assert shed.status_code == 429, shed.content
    assert shed.json()["error"]["code"] == "backlogged"
    assert send(api, "promo", "marketing", priority="normal").status_code == 429
    assert send(api, "otp", "security", priority="low").status_code == 429

    assert send(api, "otp", "security").status_code == 202
    # Marketing may not ask for high (its max_priority is normal): refused before any backlog question.
    assert send(api, "promo", "marketing", priority="high").status_code == 403
    assert send(api, "likes", "social").status_code == 202  # normal, and its category is not low by default
    assert Notification.objects.count() == 2


def test_429_carries_retry_after(api: Any, backlog: None, settings: Any) -> None:
    settings.BACKPRESSURE_RETRY_AFTER_SECONDS = 7
    response = send(api, "promo", "marketing")
    assert response.status_code == 429
    assert response["Retry-After"] == "7"


def test_below_the_limit_nothing_is_shed(api: Any, backlog: None, settings: Any) -> None:
    settings.BACKPRESSURE_LOW_QUEUE_DEPTH = 6
    backpressure.reset_cache()
    assert send(api, "promo", "marketing").status_code == 202


def test_the_batch_endpoint_sheds_per_item(api: Any, backlog: None) -> None:
    items = [
        {"recipient": {"user_id": "u-1"}, "category": "marketing", "template": "promo"},
        {"recipient": {"user_id": "u-1"}, "category": "security", "template": "otp"},
    ]
    results = api.post("/api/v1/notifications/batch", items, format="json").json()["results"]
    assert results[0]["status"] == 429 and results[0]["error"]["code"] == "backlogged"
    assert "error" not in results[1] and results[1]["duplicate"] is False


def test_the_measurement_is_cached_per_process(backlog: None, settings: Any) -> None:
    settings.BACKPRESSURE_CACHE_SECONDS = 60
    backpressure.reset_cache()
    assert backpressure.low_backlog() == 6
    fill("email.low", 10)
    assert backpressure.low_backlog() == 6
    backpressure.reset_cache()
    assert backpressure.low_backlog() == 16


def test_an_unreachable_broker_sheds_nothing(api: Any, settings: Any) -> None:
    settings.BACKPRESSURE_LOW_QUEUE_DEPTH = 1
    settings.BACKPRESSURE_CACHE_SECONDS = 0
    backpressure.reset_cache()
    previous = celery_app.conf.broker_url
    celery_app.conf.broker_url = "amqp://guest:guest@127.0.0.1:1/none"  # type: ignore[misc]  # settable at run time
    try:
        assert backpressure.low_backlog() is None
        assert send(api, "promo", "marketing").status_code == 202
    finally:
        celery_app.conf.broker_url = previous  # type: ignore[misc]  # celery-types: a read-only property
        backpressure.reset_cache()
