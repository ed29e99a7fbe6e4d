"""Audit entries for every kind of change through the API and the admin: recipients (contact data, devices,
preferences, erasure), suppressions, templates, API clients and keys; who, what, personal data masked."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse

from audit.models import AuditEntry
from notifier.clients.models import ApiClient
from preferences.models import Device
from templates_app.services import template_put
from tests.factories import make_recipient, make_suppression
from tests.templates_app.test_templates_admin import CONTENT as ADMIN_CONTENT
from tests.templates_app.test_templates_admin import _form as template_form

pytestmark = [pytest.mark.django_db, pytest.mark.staff_user("ops")]
TOKEN = "fcm-token-aaaaaaaaaaaaaaaaaaaaaaaaaaaa1111"


def entries(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action).order_by("id"))


def test_recipient_contact_data_changes_over_the_api(api_client_factory: Any) -> None:
    row, api = api_client_factory(name="billing")
    api.put("/api/v1/recipients/u-1", {"email": "old@example.com", "locale": "en"}, format="json")
    api.put("/api/v1/recipients/u-1", {"email": "new@example.com", "locale": "en"}, format="json")
    api.put("/api/v1/recipients/u-1", {"locale": "en"}, format="json")  # no change: no entry
    [created] = entries("recipient.create")
    [updated] = entries("recipient.update")
    assert (updated.actor_type, updated.actor_name, updated.actor_id) == ("client", "billing", str(row.pk))
    assert (updated.target_type, updated.target_id) == ("recipient", "u-1")
    assert list(updated.changes) == ["email"]
    stored = json.dumps([created.changes, updated.changes])
    assert "old@example.com" not in stored and "new@example.com" not in stored


def test_devices_and_a_token_moving_to_another_user(api_client_factory: Any) -> None:
    _, api = api_client_factory(name="billing")
    for user in ("u-1", "u-2"):
        api.put(f"/api/v1/recipients/{user}", {"locale": "en"}, format="json")
    api.post("/api/v1/recipients/u-1/devices", {"platform": "fcm", "token": TOKEN}, format="json")
    api.post("/api/v1/recipients/u-2/devices", {"platform": "fcm", "token": TOKEN}, format="json")
    api.delete(f"/api/v1/recipients/u-2/devices/{TOKEN}")
    added = entries("device.add")
    assert [e.target_id for e in added] == ["u-1", "u-2"]
    assert added[1].changes["moved_from_user_id"] == ["u-1", "u-2"]
    assert TOKEN not in json.dumps([e.changes for e in added])
    [removed] = entries("device.remove")
    assert removed.target_id == "u-2" and TOKEN not in json.dumps(removed.changes)


def test_preferences_and_erasure(api_client_factory: Any) -> None:
    _, api = api_client_factory(name="billing")
    api.put("/api/v1/recipients/u-1", {"email": "a@example.com", "phone": "+4915112345678"}, format="json")
    body = {"opted_out": True, "channels": {}, "categories": {}, "quiet_hours": None}
    assert api.put("/api/v1/recipients/u-1/preferences", body, format="json").status_code == 200
    [prefs] = entries("preferences.update")
    assert prefs.changes["opted_out"] == [False, True]
    assert api.delete("/api/v1/recipients/u-1").status_code in (200, 204)
    [erased] = entries("recipient.erase")
    assert set(erased.changes) >= {"email", "phone"}
    assert "a@example.com" not in json.dumps(erased.changes) and "+4915112345678" not in json.dumps(erased.changes)


def test_suppressions_over_the_api(api_client_factory: Any) -> None:
    _, api = api_client_factory(name="billing")
    created = api.post("/api/v1/suppressions", {"channel": "email", "address": "x@example.com"}, format="json")
    api.post("/api/v1/suppressions", {"channel": "email", "address": "x@example.com"}, format="json")  # exists
    api.delete(f"/api/v1/suppressions/{created.json()['id']}")
    [added] = entries("suppression.add")
    [removed] = entries("suppression.remove")
    assert added.target_id == removed.target_id == str(created.json()["id"])
    assert "x@example.com" not in json.dumps([added.changes, removed.changes])
    assert removed.changes["channel"] == ["email", None]


def test_templates_over_the_api(api_client_factory: Any) -> None:
    _, api = api_client_factory(name="billing")
    content = {"en": {"sms": {"text": "Hi"}}}
    api.put("/api/v1/templates/otp", {"category": "security", "content": content}, format="json")
    api.put("/api/v1/templates/otp", {"category": "security", "content": content, "publish": False}, format="json")
    versions = entries("template.version_create")
    assert [(e.target_id, e.changes["version"][1], e.changes["published"][1]) for e in versions] == [
        ("otp", 1, True),
        ("otp", 2, False),
    ]
    assert versions[0].actor_name == "billing"


def test_api_clients_and_keys_in_the_admin(staff: Any) -> None:
    form = {"name": "billing", "scopes": ["send"], "is_active": "on"}
    staff.post("/admin/clients/apiclient/add/", form)
    client = ApiClient.objects.get(name="billing")
    [created] = entries("api_client.create")
    assert (created.actor_type, created.actor_name, created.target_id) == ("staff", "ops", str(client.pk))
    staff.post(f"/admin/clients/apiclient/{client.pk}/change/", {**form, "scopes": ["send", "recipients:write"]})
    [updated] = entries("api_client.update")
    assert updated.changes == {"scopes": [["send"], ["send", "recipients:write"]]}
    staff.post("/admin/clients/apiclient/", {"action": "rotate_keys", "_selected_action": [client.pk]})
    [rotated] = entries("api_client.rotate_key")
    client.refresh_from_db()
    assert rotated.changes["key_prefix"][1] == client.key_prefix


def test_recipients_devices_and_suppressions_in_the_admin(staff: Any) -> None:
    recipient = make_recipient(user_id="u-9", email="before@example.com")
    url = f"/admin/preferences/recipient/{recipient.pk}/change/"
    data = {
        "user_id": "u-9", "email": "after@example.com", "phone": "", "locale": "", "timezone": "",
        "devices-TOTAL_FORMS": "1", "devices-INITIAL_FORMS": "0",
        "devices-0-platform": "fcm", "devices-0-token": TOKEN, "devices-0-active": "on",
    }  # fmt: skip
    response = staff.post(url, data)
    assert response.status_code == 302, response.content[:3000]
    [updated] = entries("recipient.update")
    assert updated.actor_type == "staff" and updated.target_id == "u-9" and list(updated.changes) == ["email"]
    assert "after@example.com" not in json.dumps(updated.changes)
    [device] = entries("device.add")
    assert device.target_id == "u-9" and TOKEN not in json.dumps(device.changes)
    assert Device.objects.filter(recipient=recipient).count() == 1

    suppression = make_suppression(channel="sms", address="+4915112345678", source="manual")
    staff.post(f"/admin/preferences/suppression/{suppression.pk}/delete/", {"post": "yes"})
    [deleted] = entries("suppression.delete")
    assert deleted.target_id == str(suppression.pk) and deleted.actor_name == "ops"


def test_templates_in_the_admin(staff: Any) -> None:
    response = staff.post(
        reverse("admin:templates_app_template_add"),
        template_form(None, key="welcome", content=ADMIN_CONTENT),
    )
    assert response.status_code == 302
    [created] = entries("template.version_create")
    assert (created.actor_type, created.target_id) == ("staff", "welcome")
    draft = template_put(key="welcome", category="transactional", default_locale="en", content=ADMIN_CONTENT,
                         publish=False)  # fmt: skip
    staff.post(reverse("admin:templates_app_templateversion_publish", args=[draft.pk]))
    # Saving with "publish" published version 1 (recorded as a publish too); then version 2 was published.
    first, published = entries("template.publish")
    assert first.changes == {"published_version": [None, 1]}
    assert published.changes == {"published_version": [1, 2]} and published.actor_name == "ops"
