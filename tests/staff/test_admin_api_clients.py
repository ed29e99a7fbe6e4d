"""The admin's API clients: adding one creates its key and shows it once, rotating shows the new one once,
scopes are checkboxes, a webhook secret must be whsec_ + base64; rotating takes the change permission."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest

from notifier.clients.auth import hash_key
from notifier.clients.models import ApiClient
from tests.conftest import bearer_client

pytestmark = [pytest.mark.django_db, pytest.mark.staff_user("ops")]
ADD = "/admin/clients/apiclient/add/"
SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def form(**extra: Any) -> dict[str, Any]:
    return {"name": "billing", "scopes": ["send", "recipients:read"], "is_active": "on", **extra}


def shown_keys(response: Any) -> list[str]:
    return re.findall(r'<code class="api-key">(ntf_[^<]+)</code>', response.content.decode())


def test_adding_a_client_creates_a_key_and_shows_it_once(staff: Any) -> None:
    response = staff.post(ADD, form())
    assert response.status_code == 200, response.content[:2000]
    assert "no-store" in response["Cache-Control"]
    [key] = shown_keys(response)
    client = ApiClient.objects.get(name="billing")
    assert client.key_hash == hash_key(key) and key.startswith(f"ntf_{client.key_prefix}_")
    assert client.scopes == ["send", "recipients:read"]
    # The change page never shows it again (only the prefix).
    page = staff.get(f"/admin/clients/apiclient/{client.pk}/change/").content.decode()
    assert key not in page and client.key_prefix in page
    # The key works, with the scopes ticked.
    http = bearer_client(key)
    assert http.get("/api/v1/recipients/nobody").status_code == 404
    assert http.get("/api/v1/suppressions").json()["error"]["code"] == "scope_missing"


def test_a_second_add_gets_its_own_key(staff: Any) -> None:
    first = shown_keys(staff.post(ADD, form(name="one")))
    second = shown_keys(staff.post(ADD, form(name="two")))
    assert len(first) == len(second) == 1 and first != second
    assert ApiClient.objects.filter(key_hash="").count() == 0
    assert ApiClient.objects.count() == 2


def test_rotate_action_shows_the_new_key_once_and_the_old_stops_working(staff: Any) -> None:
    [old] = shown_keys(staff.post(ADD, form()))
    client = ApiClient.objects.get(name="billing")
    response = staff.post("/admin/clients/apiclient/", {"action": "rotate_keys", "_selected_action": [client.pk]})
    assert response.status_code == 200
    [new] = shown_keys(response)
    assert new != old
    client.refresh_from_db()
    assert client.key_hash == hash_key(new)
    http = bearer_client(old)
    assert http.get("/api/v1/recipients/nobody").status_code == 401


def _staff_with(*codenames: str) -> Any:
    """Return a test client logged in as a staff user (not a superuser) holding these ApiClient permissions."""
    from django.contrib.auth.models import Permission
    from django.test import Client

    from tests.factories import make_staff_user

    user = make_staff_user(f"staff-{'-'.join(codenames)}")
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="clients", codename__in=codenames))
    http = Client()
    http.force_login(user)
    return http


def test_rotating_keys_takes_the_change_permission(api_client_factory: Any) -> None:
    client, api = api_client_factory(name="billing")
    changelist = "/admin/clients/apiclient/"
    rotate = {"action": "rotate_keys", "_selected_action": [client.pk]}
    viewer = _staff_with("view_apiclient")
    # A staff user who may only view API clients sees the list without the action, and cannot run it.
    page = viewer.get(changelist)
    assert page.status_code == 200 and "billing" in page.content.decode()
    assert 'value="rotate_keys"' not in page.content.decode()
    response = viewer.post(changelist, rotate, follow=True)
    assert not shown_keys(response)
    assert ApiClient.objects.get(pk=client.pk).key_hash == client.key_hash
    assert api.get("/api/v1/recipients/nobody").status_code == 404  # the old key still works
    # One who may change them is offered it, and it rotates the key.
    editor = _staff_with("view_apiclient", "change_apiclient")
    assert 'value="rotate_keys"' in editor.get(changelist).content.decode()
    [new] = shown_keys(editor.post(changelist, rotate))
    assert ApiClient.objects.get(pk=client.pk).key_hash == hash_key(new)
    assert api.get("/api/v1/recipients/nobody").status_code == 401


@pytest.mark.parametrize(
    ("secret", "reason"),
    [
        ("free text", "whsec_"),
        ("whsec_not base64!", "base64"),
        ("whsec_" + base64.b64encode(b"short").decode(), "bytes"),
    ],
)
def test_webhook_secret_is_validated_on_save(staff: Any, secret: str, reason: str) -> None:
    response = staff.post(ADD, form(webhook_secret=secret))
    assert response.status_code == 200 and not shown_keys(response)
    assert reason in response.content.decode()
    assert not ApiClient.objects.exists()


def test_a_valid_webhook_secret_is_kept(staff: Any) -> None:
    assert shown_keys(staff.post(ADD, form(webhook_secret=SECRET)))
    assert ApiClient.objects.get().webhook_secret == SECRET
