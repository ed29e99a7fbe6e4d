"""POST /api/v1/notifications/batch: one result per item, in order; the limits of a batch."""

from __future__ import annotations

from typing import Any

import pytest

from notifier.deliveries.models import Delivery, Notification
from templates_app.services import template_put
from tests.conftest import purge_all_queues
from tests.factories import make_topic

CONTENT = {"en": {"email": {"subject": "Hi {{ name }}", "text": "Hello {{ name }}"}, "sms": {"text": "Hi {{ name }}"}}}
URL = "/api/v1/notifications/batch"


@pytest.fixture(autouse=True)
def _setup(db: None) -> Any:
    template_put(key="hello", category="transactional", default_locale="en", content=CONTENT)
    yield
    purge_all_queues()


def item(user_id: str = "u-1", **extra: Any) -> dict[str, Any]:
    return {
        "recipient": {"user_id": user_id},
        "category": "transactional",
        "template": "hello",
        "channels": ["email"],
        "payload": {"name": "Ann"},
        **extra,
    }


def outcome(result: dict[str, Any]) -> str:
    """Name an item's result: its error code, "duplicate" or "accepted"."""
    if "error" in result:
        return str(result["error"]["code"])
    return "duplicate" if result["duplicate"] else "accepted"


def test_mixed_items_get_one_result_each_in_order(api: Any) -> None:
    make_topic(key="all-users", name="All")
    items = [
        item("u-1"),
        item("u-2", category="nope"),
        {**item("u-3"), "colour": "red"},
        item("u-4", dedup_key="k-1"),
        item("u-4", dedup_key="k-1"),
        {**item("u-4", dedup_key="k-1"), "payload": {"name": "Bob"}},
        {"topic": "all-users", "category": "transactional", "template": "hello", "payload": {"name": "All"}},
        {"recipient": {"user_id": "u-5"}, "topic": "all-users", "category": "transactional", "template": "hello"},
        "not an object",
        item("u-6", template="missing_template"),
    ]

    response = api.post(URL, {"notifications": items}, format="json")

    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [outcome(r) for r in results] == [
        "accepted", "invalid", "invalid", "accepted", "duplicate", "idempotency_conflict", "accepted", "invalid",
        "invalid", "invalid",
    ]  # fmt: skip
    assert [r["status"] for r in results if "error" in r] == [400, 400, 409, 400, 400, 400]
    assert results[0]["deliveries"][0]["channel"] == "email" and results[0]["duplicate"] is False
    assert results[1]["error"]["code"] == "invalid" and "category" in results[1]["error"]["fields"]
    assert results[2]["error"]["fields"] == {"colour": ["Unknown field."]}
    assert results[4]["duplicate"] is True and results[4]["id"] == results[3]["id"]
    assert results[5]["error"]["code"] == "idempotency_conflict"
    assert results[6]["topic"] == "all-users" and results[6]["deliveries"] == []
    assert "recipient" in results[7]["error"]["fields"]
    assert results[9]["error"]["fields"].get("template")
    # Only the accepted items were written: u-1, u-4 (once) and the topic notification.
    assert Notification.objects.count() == 3
    assert Delivery.objects.filter(notification__user_id="u-4").count() == 1


def test_a_bare_list_is_accepted(api: Any) -> None:
    response = api.post(URL, [item("u-1"), item("u-2", channels=["email", "sms"])], format="json")
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [outcome(r) for r in results] == ["accepted", "accepted"]
    assert len(results[1]["deliveries"]) == 2


def test_a_forbidden_category_fails_only_its_item(api_client_factory: Any) -> None:
    template_put(key="promo", category="marketing", default_locale="en", content=CONTENT)
    _, http = api_client_factory(categories=["transactional"])
    promo = {**item("u-2"), "category": "marketing", "template": "promo"}
    results = http.post(URL, [item("u-1"), promo], format="json").json()["results"]
    assert [outcome(r) for r in results] == ["accepted", "category_forbidden"]
    assert results[1]["status"] == 403


def test_limits(api: Any) -> None:
    assert api.post(URL, [item(f"u-{i}") for i in range(1001)], format="json").status_code == 400
    assert api.post(URL, {"notifications": []}, format="json").status_code == 400
    assert api.post(URL, {"notifications": {"a": 1}}, format="json").status_code == 400
    assert api.post(URL, {"something": [item()]}, format="json").status_code == 400
    assert Notification.objects.count() == 0
    full = api.post(URL, [item(f"u-{i}", channels=["email"]) for i in range(1000)], format="json")
    assert full.status_code == 200
    assert len(full.json()["results"]) == 1000
    assert Notification.objects.count() == 1000


def test_every_item_carries_its_http_status(api: Any) -> None:
    results = api.post(URL, [item("u-1", dedup_key="a"), item("u-1", dedup_key="a")], format="json").json()["results"]
    assert [r["status"] for r in results] == [202, 200]


def test_unauthenticated_is_401(client: Any) -> None:
    response = client.post(URL, [item()], content_type="application/json")
    assert response.status_code == 401
