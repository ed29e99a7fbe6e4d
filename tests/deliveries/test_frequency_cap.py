"""Frequency caps per category and recipient: atomic under concurrency, with or without Redis, on accept and worker."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from channels_app.services import deliver
from core.redis_guard import get_redis
from notifier.deliveries.models import Delivery
from preferences.services import recipient_upsert, topic_subscribe, topic_upsert
from templates_app.services import template_put
from tests.conftest import at_once, bearer_client, wait_for
from tests.redis_server import free_port

CONTENT = {"en": {"email": {"subject": "News", "text": "Hello"}, "inapp": {"title": "News", "body": "Hello"}}}
CAP = {"max": 3, "per_seconds": 3600}


def _categories(settings: Any, **caps: dict[str, int]) -> dict[str, Any]:
    categories = {name: dict(rules) for name, rules in settings.NOTIFIER_CATEGORIES.items()}
    for name, cap in caps.items():
        categories[name]["frequency_cap"] = cap
    settings.NOTIFIER_CATEGORIES = categories
    return categories


@pytest.fixture
def templates() -> None:
    template_put(key="news", category="social", default_locale="en", content=CONTENT)
    template_put(key="otp", category="security", default_locale="en", content=CONTENT)
    recipient_upsert(user_id="fc-1", email="fc-1@example.com")


@pytest.fixture
def redis_down(settings: Any) -> Any:
    """Point this process's Redis client at a port nothing listens on."""
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    get_redis.cache_clear()
    yield
    get_redis.cache_clear()


def _post_concurrently(api_key: str, n: int, template: str = "news") -> list[dict[str, Any]]:
    """POST `n` notifications for one recipient from `n` threads released at once; return the answers."""

    def one() -> dict[str, Any]:
        http = bearer_client(api_key)
        body = {"recipient": {"user_id": "fc-1"}, "template": template, "category": "social"}
        body["channels"] = ["email", "inapp"]
        response = http.post("/api/v1/notifications", body, format="json")
        return {"code": response.status_code, **response.json()}

    return at_once(n, one)


def _through(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the accepted notifications whose deliveries were not capped."""
    assert all(a["code"] == 202 for a in answers), answers
    passed = [a for a in answers if all(d["reason"] != "frequency_cap" for d in a["deliveries"])]
    capped = [a for a in answers if a not in passed]
    for a in capped:
        assert {(d["status"], d["reason"]) for d in a["deliveries"]} == {("suppressed", "frequency_cap")}
    return passed


def _api_key(api_client_factory: Any) -> str:
    from notifier.clients.services import api_client_create

    _, raw = api_client_create(name="fc-svc")
    return raw


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("templates")
def test_fifty_concurrent_requests_let_exactly_max_through(settings: Any, api_client_factory: Any) -> None:
    _categories(settings, social=CAP)
    answers = _post_concurrently(_api_key(api_client_factory), 50)
    passed = _through(answers)
    assert len(answers) == 50 and len(passed) == CAP["max"]
    assert Delivery.objects.exclude(reason="frequency_cap").count() == CAP["max"] * 2  # email + in-app each
    assert Delivery.objects.filter(status="suppressed", reason="frequency_cap").count() == (50 - CAP["max"]) * 2
    # The Redis window holds exactly the admitted notifications.
    keys = list(get_redis().scan_iter(f"{settings.REDIS_KEY_PREFIX}fcap:*"))
    assert len(keys) == 1 and get_redis().zcard(keys[0]) == CAP["max"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("templates", "redis_down")
def test_fifty_concurrent_requests_without_redis_let_exactly_max_through(
    settings: Any, api_client_factory: Any
) -> None:
    _categories(settings, social=CAP)
    answers = _post_concurrently(_api_key(api_client_factory), 50)
    assert len(_through(answers)) == CAP["max"]
    assert Delivery.objects.filter(reason="frequency_cap").count() == (50 - CAP["max"]) * 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("templates")
def test_uncapped_categories_and_other_recipients_are_not_limited(settings: Any, api: Any) -> None:
    _categories(settings, social={"max": 1, "per_seconds": 3600})
    recipient_upsert(user_id="fc-2", email="fc-2@example.com")
    for _ in range(5):
        otp = api.post(
            "/api/v1/notifications",
            {"recipient": {"user_id": "fc-1"}, "template": "otp", "category": "security"},
            format="json",
        )
        assert all(d["reason"] != "frequency_cap" for d in otp.json()["deliveries"])
    first = api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": "fc-2"}, "template": "news", "category": "social"},
        format="json",
    )
    second = api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": "fc-2"}, "template": "news", "category": "social"},
        format="json",
    )
    assert {d["status"] for d in first.json()["deliveries"]} == {"queued"}
    assert {d["reason"] for d in second.json()["deliveries"]} == {"frequency_cap"}
    assert Delivery.objects.filter(reason="frequency_cap").count() == 2  # fc-2's second, on both channels


@pytest.mark.django_db(transaction=True)
def test_topic_deliveries_are_capped_on_the_worker(settings: Any, api: Any, start_worker: Any) -> None:
    """Topic deliveries are written by the fan-out, which checks the cap for the in-app items it stores itself."""
    categories = _categories(settings, social={"max": 2, "per_seconds": 3600})
    template_put(key="news", category="social", default_locale="en", content=CONTENT)
    topic, _ = topic_upsert(key="weekly", name="Weekly")
    for uid in ("fc-a", "fc-b"):
        recipient_upsert(user_id=uid)
    topic_subscribe(topic=topic, user_ids=["fc-a", "fc-b"])
    start_worker(queues=["inapp.high", "inapp.low", "fanout"], env={"NOTIFIER_CATEGORIES": json.dumps(categories)})
    for _ in range(5):
        body = {"topic": "weekly", "template": "news", "category": "social", "channels": ["inapp"]}
        assert api.post("/api/v1/notifications", body, format="json").status_code == 202
    wait_for(lambda: Delivery.objects.filter(status__in=["sent", "suppressed"]).count() == 10, 60)
    sent = Counter(Delivery.objects.filter(status="sent").values_list("recipient__user_id", flat=True))
    assert sent == {"fc-a": 2, "fc-b": 2}
    assert Delivery.objects.filter(status="suppressed", reason="frequency_cap").count() == 6


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("templates")
def test_worker_recheck_without_redis_passes_the_first_max_by_creation(settings: Any, api: Any) -> None:
    """Accepted while Redis was up with no cap; capped later with Redis down: the oldest `max` still go."""
    for _ in range(4):
        api.post(
            "/api/v1/notifications",
            {"recipient": {"user_id": "fc-1"}, "template": "news", "category": "social"},
            format="json",
        )
    _categories(settings, social={"max": 2, "per_seconds": 3600})
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    get_redis.cache_clear()
    try:
        ids = list(Delivery.objects.order_by("id").values_list("id", flat=True))
        report = deliver(ids)
    finally:
        get_redis.cache_clear()
    first_two = set(Delivery.objects.order_by("notification__created_at").values_list("notification_id", flat=True)[:4])
    assert report.sent == 4 and report.suppressed == 4
    sent = set(Delivery.objects.filter(status="sent").values_list("notification_id", flat=True))
    assert sent == first_two


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("templates")
@pytest.mark.parametrize("redis", ["up", "down"])
def test_a_batch_to_one_recipient_lets_max_through_counting_its_own_items(
    settings: Any, api: Any, redis: str, request: Any
) -> None:
    """A batch's items are written in one statement, so the database's count cannot see them: the accept counts them."""
    _categories(settings, social=CAP)
    if redis == "down":
        request.getfixturevalue("redis_down")
    body = {"recipient": {"user_id": "fc-1"}, "template": "news", "category": "social", "channels": ["email"]}
    answer = api.post("/api/v1/notifications/batch", {"notifications": [body] * 5}, format="json")
    assert answer.status_code == 200, answer.content
    results = answer.json()["results"]
    assert [r["status"] for r in results] == [202] * 5
    reasons = [r["deliveries"][0]["reason"] for r in results]
    assert reasons == [""] * CAP["max"] + ["frequency_cap"] * (5 - CAP["max"])
    assert Delivery.objects.filter(status="queued").count() == CAP["max"]
