"""Template ownership: a client owns what it creates over the API; others send it, templates:admin changes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from audit.models import AuditEntry
from core.scopes import SCOPES
from templates_app.models import Template
from templates_app.services import template_put
from tests import factories

CONTENT = {"en": {"email": {"subject": "Reset your password", "text": "Use {{ link }}"}}}
PHISH = {"en": {"email": {"subject": "Reset your password", "text": "Log in at https://evil.example/{{ link }}"}}}
WRITER = ["send", "templates"]


def put(api: Any, key: str, content: dict[str, Any] = CONTENT, publish: bool = True) -> Any:
    body = {"category": "transactional", "default_locale": "en", "content": content, "publish": publish}
    return api.put(f"/api/v1/templates/{key}", body, format="json")


@pytest.fixture
def clients(api_client_factory: Callable[..., tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    return {
        "auth": api_client_factory(name="auth-service", scopes=WRITER),
        "shop": api_client_factory(name="shop-service", scopes=WRITER),
        "admin": api_client_factory(name="template-admin", scopes=[*WRITER, "templates:admin"]),
    }


@pytest.mark.django_db
def test_another_client_cannot_change_or_publish_a_template_but_may_send_it(clients: Any) -> None:
    (auth, auth_api), (_, shop_api) = clients["auth"], clients["shop"]
    assert put(auth_api, "password_reset").status_code == 201
    template = Template.objects.get(key="password_reset")
    assert template.owner_client_id == auth.pk

    for publish in (True, False):  # neither a published version nor a draft
        refused = put(shop_api, "password_reset", PHISH, publish=publish)
        assert refused.status_code == 403, refused.content
        error = refused.json()["error"]
        assert error["code"] == "template_owned_by_another_client"
        assert "templates:admin" in error["message"] and "key" in error["fields"]
    template.refresh_from_db()
    assert template.versions.count() == 1 and template.published_version.content == CONTENT
    assert not AuditEntry.objects.filter(actor_name="shop-service").exists()

    # Sending it is not changing it: the other client's categories decide, as for any template.
    factories.make_recipient(user_id="u-1", email="u-1@example.com")
    sent = shop_api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": "u-1"}, "template": "password_reset", "payload": {"link": "x"}},
        format="json",
    )
    assert sent.status_code == 202, sent.content

    assert auth_api.get("/api/v1/templates/password_reset").json()["owner"] == "you"
    assert shop_api.get("/api/v1/templates/password_reset").json()["owner"] == "another_client"
    assert put(auth_api, "password_reset", {"en": {"email": {"subject": "v2", "text": "t"}}}).status_code == 201


@pytest.mark.django_db
def test_templates_admin_changes_any_template_and_the_audit_log_says_who(clients: Any) -> None:
    (auth, auth_api), (admin, admin_api) = clients["auth"], clients["admin"]
    assert put(auth_api, "password_reset").status_code == 201
    changed = put(admin_api, "password_reset", {"en": {"email": {"subject": "Reset", "text": "New {{ link }}"}}})
    assert changed.status_code == 201, changed.content
    template = Template.objects.get(key="password_reset")
    assert template.published_version.version == 2
    assert template.owner_client_id == auth.pk  # changing is not taking over

    entries = list(AuditEntry.objects.filter(target_type="template", target_id="password_reset").order_by("id"))
    assert [(e.actor_name, e.action) for e in entries] == [
        ("auth-service", "template.version_create"),
        ("template-admin", "template.version_create"),
    ]
    assert entries[0].changes["owner_client_id"] == [None, auth.pk]
    assert entries[1].actor_type == "client" and entries[1].actor_id == str(admin.pk)
    assert entries[1].changes["version"] == [None, 2]


@pytest.mark.django_db
def test_staff_owned_templates_change_over_the_api_only_with_templates_admin(clients: Any) -> None:
    # Made in the admin or by bootstrap_demo: no client.
    template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)
    assert Template.objects.get(key="order_shipped").owner_client_id is None
    (_, auth_api), (_, admin_api) = clients["auth"], clients["admin"]

    refused = put(auth_api, "order_shipped", PHISH)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "template_owned_by_staff"
    assert auth_api.get("/api/v1/templates/order_shipped").json()["owner"] == "staff"
    assert put(admin_api, "order_shipped", PHISH).status_code == 201
    assert Template.objects.get(key="order_shipped").owner_client_id is None


@pytest.mark.django_db
def test_staff_change_a_client_owned_template_without_taking_it_over(clients: Any) -> None:
    auth, auth_api = clients["auth"]
    assert put(auth_api, "password_reset").status_code == 201
    staff_user = factories.make_staff_user("editor", superuser=True)
    version = template_put(
        key="password_reset", category="transactional", default_locale="en", content=PHISH, audit_actor=staff_user
    )
    assert version.version == 2 and Template.objects.get(key="password_reset").owner_client_id == auth.pk


@pytest.mark.django_db
def test_the_demo_key_keeps_every_scope_including_templates_admin() -> None:
    assert "templates:admin" in SCOPES


@pytest.mark.django_db
def test_the_admin_shows_whose_template_it_is(clients: Any, staff: Any) -> None:
    auth, auth_api = clients["auth"]
    assert put(auth_api, "password_reset").status_code == 201
    template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)
    owned = staff.get(f"/admin/templates_app/template/{Template.objects.get(key='password_reset').pk}/change/")
    assert owned.status_code == 200 and f"API client #{auth.pk}".encode() in owned.content
    staff_owned = staff.get(f"/admin/templates_app/template/{Template.objects.get(key='order_shipped').pk}/change/")
    assert b"staff (over the API only keys with templates:admin change it)" in staff_owned.content
