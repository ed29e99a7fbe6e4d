"""Recipients, devices, preferences and suppressions over the REST API, and erasure of personal data."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import include, path
from rest_framework.test import APIClient

from channels_app.models import SandboxMessage
from notifier.clients.models import ApiClient
from preferences.models import Device, Recipient, Subscription, Suppression
from tests.factories import (
    make_delivery,
    make_delivery_event,
    make_notification,
    make_sandbox_message,
    make_subscription,
    make_topic,
)

# Only the preferences API (under /api/v1/, as notifier/urls.py mounts it) and the unsubscribe pages.
urlpatterns = [
    path("api/v1/", include("preferences.urls")),
    path("", include("preferences.unsubscribe_urls")),
]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


def _fields(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]["fields"]


def test_requires_api_key() -> None:
    assert APIClient().get("/api/v1/recipients/u-1").status_code == 401


def test_recipient_put_creates_then_updates(api: APIClient) -> None:
    body = {"email": "a@example.com", "phone": "+4915112345678", "locale": "de-DE", "timezone": "Europe/Berlin"}
    r = api.put("/api/v1/recipients/u-1", body, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["email"] == "a@example.com" and r.json()["timezone"] == "Europe/Berlin"
    r = api.put("/api/v1/recipients/u-1", {"webhook_url": "https://hooks.example.com/x"}, format="json")
    assert r.status_code == 200
    got = api.get("/api/v1/recipients/u-1").json()
    assert got["email"] == "a@example.com"  # fields left out are kept
    assert got["webhook_url"] == "https://hooks.example.com/x"
    assert got["preferences"]["opted_out"] is False
    assert api.get("/api/v1/recipients/nobody").status_code == 404
    assert api.get("/api/v1/recipients/nobody").json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("email", "not-an-email"),
        ("phone", "015112345678"),
        ("phone", "+0123"),
        ("timezone", "Mars/Olympus"),
        ("timezone", "../etc/passwd"),
        ("locale", "not a locale"),
        ("webhook_url", "ftp://example.com/x"),
        ("webhook_url", "nope"),
    ],
)
def test_recipient_validation_names_the_field(api: APIClient, field: str, value: str) -> None:
    r = api.put("/api/v1/recipients/u-bad", {field: value}, format="json")
    assert r.status_code == 400
    assert field in _fields(r)
    assert not Recipient.objects.filter(user_id="u-bad").exists()


def test_devices_register_idempotently_and_delete(api: APIClient) -> None:
    api.put("/api/v1/recipients/u-d", {}, format="json")
    for _ in range(2):
        r = api.post("/api/v1/recipients/u-d/devices", {"platform": "fcm", "token": "tok:abc"}, format="json")
        assert r.status_code == 201
    assert Device.objects.filter(token="tok:abc").count() == 1
    assert api.get("/api/v1/recipients/u-d").json()["devices"] == [{"platform": "fcm", "token": "tok:abc"}]
    assert "token" in _fields(api.post("/api/v1/recipients/u-d/devices", {"platform": "fcm"}, format="json"))
    assert "platform" in _fields(
        api.post("/api/v1/recipients/u-d/devices", {"platform": "carrier-pigeon", "token": "t"}, format="json")
    )
    assert api.post("/api/v1/recipients/nobody/devices", {"token": "t"}, format="json").status_code == 404
    assert api.delete("/api/v1/recipients/u-d/devices/tok:abc").status_code == 204
    assert api.delete("/api/v1/recipients/u-d/devices/tok:abc").status_code == 404
    assert not Device.objects.exists()


def test_suppressed_token_stays_inactive_when_registered_again(api: APIClient) -> None:
    api.put("/api/v1/recipients/u-d", {}, format="json")
    api.post("/api/v1/recipients/u-d/devices", {"token": "dead"}, format="json")
    api.post("/api/v1/suppressions", {"channel": "push", "address": "dead"}, format="json")
    r = api.post("/api/v1/recipients/u-d/devices", {"token": "dead"}, format="json")
    assert r.status_code == 201 and r.json()["active"] is False


PREFS = {
    "opted_out": False,
    "channels": {"sms": False},
    "categories": {"marketing": {"enabled": True, "channels": ["email"], "frequency": "daily_digest"}},
    "quiet_hours": {"start": "22:00", "end": "08:00"},
}


def test_preferences_round_trip(api: APIClient) -> None:
    api.put("/api/v1/recipients/u-p", {}, format="json")
    empty = api.get("/api/v1/recipients/u-p/preferences").json()
    assert empty == {"opted_out": False, "channels": {}, "categories": {}, "quiet_hours": None}
    r = api.put("/api/v1/recipients/u-p/preferences", PREFS, format="json")
    assert r.status_code == 200, r.content
    assert r.json() == PREFS
    assert api.get("/api/v1/recipients/u-p/preferences").json() == PREFS
    recipient = Recipient.objects.get(user_id="u-p")
    assert recipient.quiet_start.hour == 22 and recipient.category_prefs["marketing"]["frequency"] == "daily_digest"
    # PUT replaces: quiet hours and categories left out are cleared.
    r = api.put("/api/v1/recipients/u-p/preferences", {"opted_out": True}, format="json")
    assert r.json() == {"opted_out": True, "channels": {}, "categories": {}, "quiet_hours": None}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"channels": {"fax": False}}, "channels.fax"),
        ({"channels": {"sms": "maybe"}}, "channels.sms"),
        ({"categories": {"gossip": {"enabled": True}}}, "categories.gossip"),
        ({"categories": {"marketing": {"frequency": "weekly"}}}, "categories.marketing.frequency"),
        ({"categories": {"marketing": {"channels": ["email", "fax"]}}}, "categories.marketing.channels"),
        ({"categories": {"marketing": {"colour": "red"}}}, "categories.marketing.colour"),
        ({"categories": {"security": {"enabled": False}}}, "categories.security"),
        ({"categories": {"transactional": {"enabled": False}}}, "categories.transactional"),
        ({"quiet_hours": {"start": "25:00", "end": "08:00"}}, "quiet_hours.start"),
        ({"quiet_hours": {"start": "22:00", "end": "8am"}}, "quiet_hours.end"),
        ({"quiet_hours": {"start": "22:00"}}, "quiet_hours.end"),
        ({"quiet_hours": {"start": "22:00", "end": "22:00"}}, "quiet_hours.end"),
        ({"opted_out": "perhaps"}, "opted_out"),
    ],
)
def test_preferences_validation(api: APIClient, body: dict[str, Any], field: str) -> None:
    api.put("/api/v1/recipients/u-p", {}, format="json")
    r = api.put("/api/v1/recipients/u-p/preferences", body, format="json")
    assert r.status_code == 400, r.content
    assert any(key.startswith(field) for key in _fields(r)), _fields(r)


def test_preferences_of_unknown_recipient_404(api: APIClient) -> None:
    assert api.get("/api/v1/recipients/ghost/preferences").status_code == 404
    assert api.put("/api/v1/recipients/ghost/preferences", PREFS, format="json").status_code == 404


def test_suppressions_add_list_page_and_delete(api: APIClient) -> None:
    r = api.post(
        "/api/v1/suppressions", {"channel": "email", "address": "x@example.com", "reason": "asked"}, format="json"
    )
    assert r.status_code == 201
    sid = r.json()["id"]
    assert r.json()["source"] == "manual"
    again = api.post("/api/v1/suppressions", {"channel": "email", "address": "x@example.com"}, format="json")
    assert again.status_code == 200 and again.json()["id"] == sid
    for i in range(5):
        api.post("/api/v1/suppressions", {"channel": "sms", "address": f"+1555000000{i}"}, format="json")
    assert "channel" in _fields(api.post("/api/v1/suppressions", {"channel": "fax", "address": "1"}, format="json"))
    assert "address" in _fields(api.post("/api/v1/suppressions", {"channel": "sms"}, format="json"))

    only = api.get("/api/v1/suppressions", {"channel": "email", "address": "x@example.com"}).json()
    assert [s["id"] for s in only["results"]] == [sid] and only["next_cursor"] is None
    seen: list[int] = []
    cursor: str | None = None
    while True:
        params: dict[str, str | int] = {"channel": "sms", "limit": 2, **({"cursor": cursor} if cursor else {})}
        page = api.get("/api/v1/suppressions", params).json()
        seen += [s["id"] for s in page["results"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 5 and seen == sorted(seen) and len(set(seen)) == 5
    assert api.get("/api/v1/suppressions", {"cursor": "!!"}).status_code == 400
    assert api.get("/api/v1/suppressions", {"limit": 0}).status_code == 400

    assert api.delete(f"/api/v1/suppressions/{sid}").status_code == 204
    assert api.delete(f"/api/v1/suppressions/{sid}").status_code == 404
    assert not Suppression.objects.filter(pk=sid).exists()


def test_erasure_wipes_personal_data_and_keeps_rows(api: APIClient, service: ApiClient) -> None:
    api.put(
        "/api/v1/recipients/u-e",
        {"email": "e@example.com", "phone": "+4915112345678", "webhook_url": "https://h.example.com/"},
        format="json",
    )
    api.put("/api/v1/recipients/u-e/preferences", PREFS, format="json")
    api.post("/api/v1/recipients/u-e/devices", {"token": "tok-e"}, format="json")
    recipient = Recipient.objects.get(user_id="u-e")
    topic = make_topic(key="news")
    make_subscription(topic=topic, recipient=recipient)
    other, _ = Recipient.objects.get_or_create(user_id="u-other")
    n = make_notification(
        client=service, category="transactional", template_key="t", recipient=recipient, priority="high"
    )
    mine = make_delivery(
        notification=n, recipient=recipient, channel="email", priority="high", address="e@example.com",
        status="sent", content={"subject": "Hello Erin"},
    )  # fmt: skip
    theirs = make_delivery(
        notification=n, recipient=other, channel="email", priority="high", address="o@example.com", status="sent"
    )
    make_sandbox_message(delivery_id=mine.pk, channel="email", address="e@example.com", content={"s": 1})
    make_sandbox_message(delivery_id=theirs.pk, channel="email", address="o@example.com", content={"s": 2})
    make_delivery_event(delivery=mine, status="sent", at=mine.created_at)

    assert api.delete("/api/v1/recipients/u-e").status_code == 204
    assert api.get("/api/v1/recipients/u-e").status_code == 404
    assert api.delete("/api/v1/recipients/u-e").status_code == 404

    recipient.refresh_from_db()
    assert recipient.erased_at is not None
    assert (recipient.email, recipient.phone, recipient.webhook_url) == ("", "", "")
    assert not recipient.opted_out and recipient.channel_prefs == {} and recipient.category_prefs == {}
    assert recipient.quiet_start is None and not Device.objects.filter(recipient=recipient).exists()
    assert not Subscription.objects.filter(recipient=recipient).exists()
    mine.refresh_from_db()
    assert mine.address == "" and mine.content is None and mine.status == "sent"
    assert mine.events.count() == 1  # history kept
    msg = SandboxMessage.objects.get(delivery_id=mine.pk)
    assert msg.address == "" and msg.content == {}
    # Someone else's data is untouched.
    theirs.refresh_from_db()
    assert theirs.address == "o@example.com"
    assert SandboxMessage.objects.get(delivery_id=theirs.pk).address == "o@example.com"

    # The user_id itself is personal data: the erased row keeps only a stand-in naming the row.
    assert recipient.user_id == f"erased:{recipient.pk}"
    # Upserting the user_id again makes a new recipient with only the new data.
    assert api.put("/api/v1/recipients/u-e", {"locale": "en"}, format="json").status_code == 201
    got = api.get("/api/v1/recipients/u-e").json()
    assert got["email"] == "" and got["locale"] == "en"
    assert Recipient.objects.get(user_id="u-e").pk != recipient.pk
