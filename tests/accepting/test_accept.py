"""Accepting notifications: authentication, validation, idempotency (with and without Redis)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from core.redis_guard import get_redis
from notifier.deliveries.models import Delivery, Notification
from templates_app.services import template_put
from tests.conftest import at_once, bearer_client

CONTENT = {"en": {"email": {"subject": "Hi {{ name }}", "text": "Hello {{ name }}"}, "sms": {"text": "Hi {{ name }}"}}}


@pytest.fixture
def template(db: None) -> None:
    template_put(key="welcome", category="transactional", default_locale="en", content=CONTENT)


def body(**extra: Any) -> dict[str, Any]:
    return {
        "recipient": {"user_id": "u-7"},
        "category": "transactional",
        "template": "welcome",
        "payload": {"name": "Ada"},
        **extra,
    }


def test_requires_an_api_key(db: None) -> None:
    response = APIClient().post("/api/v1/notifications", body(), format="json")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"
    bad = bearer_client("ntf_nope")
    assert bad.post("/api/v1/notifications", body(), format="json").status_code == 401


def test_category_not_allowed_for_client_is_403(api_client_factory: Any, template: None) -> None:
    _, http = api_client_factory(categories=["marketing"])
    response = http.post("/api/v1/notifications", body(), format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "category_forbidden"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"category": "nope"}, "category"),
        ({"template": "missing"}, "template"),
        ({"template": "bad key!"}, "template"),
        ({"channels": ["fax"]}, "channels.0"),
        ({"channels": ["push"]}, "channels"),
        ({"channels": []}, "channels"),
        ({"priority": "urgent"}, "priority"),
        ({"payload": "x"}, "payload"),
        # PostgreSQL stores no NUL in text or jsonb: refused up front, in a value, a nested one or a key.
        ({"payload": {"code": "12\u00003"}}, "payload"),
        ({"payload": {"items": [{"name": "a\u0000"}]}}, "payload"),
        ({"payload": {"k\u0000": 1}}, "payload"),
        ({"dedup_key": "k\u0000"}, "dedup_key"),
        ({"topic": "all"}, "recipient"),
        ({"recipient": {}}, "recipient.user_id"),
        ({"send_at": "tomorrow"}, "send_at"),
        ({"extra": 1}, "extra"),
    ],
)
def test_invalid_input_is_a_400_naming_the_field(api: Any, template: None, override: dict, field: str) -> None:
    response = api.post("/api/v1/notifications", body(**override), format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["fields"], error
    assert Notification.objects.count() == 0


def _nested_payload_body(levels: int) -> str:
    fields = body()
    del fields["payload"]
    return json.dumps(fields)[:-1] + ', "payload": ' + '{"a":' * levels + "1" + "}" * levels + "}"


def test_a_body_nested_to_the_limit_is_accepted(api: Any, template: None) -> None:
    """The body is level 1, so a payload of 63 levels nests the body 64 deep: the documented limit."""
    response = api.post("/api/v1/notifications", _nested_payload_body(63), content_type="application/json")
    assert response.status_code == 202, response.content[:300]


@pytest.mark.parametrize("levels", [64, 600, 900, 1200])
def test_a_body_nested_past_the_limit_is_malformed_json(api: Any, template: None, levels: int) -> None:
    """Past 64 levels, and far past Python's recursion limit, a body is a 400 (was a 500 at 900 and 1,200)."""
    response = api.post("/api/v1/notifications", _nested_payload_body(levels), content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == "malformed_json"
    assert "64" in error["message"]
    assert Notification.objects.count() == 0


def test_malformed_json_is_a_400(api: Any) -> None:
    response = api.post("/api/v1/notifications", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_json"


@pytest.mark.parametrize(("raw", "message"), [("null", "No data provided"), ("[1]", "Invalid data")])
def test_a_body_that_is_not_an_object_is_a_400(api: Any, raw: str, message: str) -> None:
    """The send body is validated by a reused serializer instance: errors keep the shape is_valid gives them."""
    response = api.post("/api/v1/notifications", raw, content_type="application/json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert message in str(error["fields"]["non_field_errors"]), error
    assert Notification.objects.count() == 0


def test_unknown_user_gets_suppressed_deliveries_for_missing_addresses(api: Any, template: None) -> None:
    response = api.post("/api/v1/notifications", body(), format="json")
    assert response.status_code == 202
    deliveries = response.json()["deliveries"]
    assert {(d["channel"], d["status"], d["reason"]) for d in deliveries} == {
        ("email", "suppressed", "no_address"),
        ("sms", "suppressed", "no_address"),
    }


def test_duplicate_returns_the_original_and_conflict_is_409(api: Any, template: None) -> None:
    first = api.post("/api/v1/notifications", body(dedup_key="k-1"), format="json")
    again = api.post("/api/v1/notifications", body(dedup_key="k-1"), format="json")
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["duplicate"] is True
    other = api.post("/api/v1/notifications", body(dedup_key="k-1", payload={"name": "Bob"}), format="json")
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_conflict"
    assert Notification.objects.count() == 1


def test_dedup_keys_are_per_client(api_client_factory: Any, template: None) -> None:
    _, a = api_client_factory()
    _, b = api_client_factory()
    ids = {http.post("/api/v1/notifications", body(dedup_key="same"), format="json").json()["id"] for http in (a, b)}
    assert len(ids) == 2


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_requests_with_one_key_create_one_notification(api_client_factory: Any) -> None:
    template_put(key="welcome", category="transactional", default_locale="en", content=CONTENT)
    client, _ = api_client_factory()
    from notifier.clients.services import api_client_rotate_key

    raw_key = api_client_rotate_key(client=client)

    def call() -> tuple[int, str]:
        response = bearer_client(raw_key).post("/api/v1/notifications", body(dedup_key="race"), format="json")
        return response.status_code, response.json()["id"]

    results = at_once(50, call)
    assert Notification.objects.filter(dedup_key="race").count() == 1
    original = Notification.objects.get(dedup_key="race")
    assert {notification_id for _, notification_id in results} == {str(original.pk)}
    assert sorted(code for code, _ in results) == [200] * 49 + [202]
    assert Delivery.objects.filter(notification=original).count() == 2


def test_dedup_falls_back_to_the_database_when_redis_is_down(api: Any, template: None, settings: Any) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    get_redis.cache_clear()
    try:
        first = api.post("/api/v1/notifications", body(dedup_key="no-redis"), format="json")
        again = api.post("/api/v1/notifications", body(dedup_key="no-redis"), format="json")
        conflict = api.post("/api/v1/notifications", body(dedup_key="no-redis", payload={"name": "X"}), format="json")
    finally:
        get_redis.cache_clear()
    assert (first.status_code, again.status_code, conflict.status_code) == (202, 200, 409)
    assert again.json()["id"] == first.json()["id"]


def test_get_notification_is_scoped_to_its_client(api_client_factory: Any, template: None) -> None:
    _, owner = api_client_factory()
    _, stranger = api_client_factory()
    created = owner.post("/api/v1/notifications", body(), format="json").json()
    assert owner.get(f"/api/v1/notifications/{created['id']}").status_code == 200
    assert stranger.get(f"/api/v1/notifications/{created['id']}").status_code == 404


def test_list_and_cancel_a_scheduled_notification(api: Any, template: None) -> None:
    from preferences.services import recipient_upsert

    recipient_upsert(user_id="u-7", email="u7@example.com")
    created = api.post("/api/v1/notifications", body(send_at="2099-01-01T00:00:00Z"), format="json").json()
    statuses = {d["channel"]: d["status"] for d in created["deliveries"]}
    assert statuses == {"email": "scheduled", "sms": "suppressed"}
    listed = api.get("/api/v1/notifications", {"user_id": "u-7"}).json()
    assert [n["id"] for n in listed["results"]] == [created["id"]]
    assert api.get("/api/v1/notifications", {"cursor": "garbage"}).status_code == 400
    cancelled = api.post(f"/api/v1/notifications/{created['id']}/cancel").json()
    assert cancelled["cancelled"] == 1
    detail = api.get(f"/api/v1/notifications/{created['id']}").json()
    email = next(d for d in detail["deliveries"] if d["channel"] == "email")
    assert email["status"] == "cancelled"
    assert [e["status"] for e in email["events"]] == ["scheduled", "cancelled"]
