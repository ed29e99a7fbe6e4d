"""Templates are shared within a project environment: every key of it with `templates` changes and publishes any.

`owner_client_id` only says who made a template; `templates:admin` grants nothing more than `templates`. A
template of another project, or of the other environment of the same project, is not found (404).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from audit.models import AuditEntry
from core.scopes import SCOPES
from projects.services import project_create
from templates_app.models import Template
from templates_app.services import template_put
from tests import factories

CONTENT = {"en": {"email": {"subject": "Reset your password", "text": "Use {{ link }}"}}}
CHANGED = {"en": {"email": {"subject": "Reset your password now", "text": "Use {{ link }} today"}}}
WRITER = ["send", "templates"]


def put(api: Any, key: str, content: dict[str, Any] = CONTENT, publish: bool = True) -> Any:
    body = {"category": "transactional", "default_locale": "en", "content": content, "publish": publish}
    return api.put(f"/api/v1/templates/{key}", body, format="json")


@pytest.fixture
def clients(api_client_factory: Callable[..., tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    project_create(slug="other", name="Other")
    return {
        "auth": api_client_factory(name="auth-service", scopes=WRITER),
        "shop": api_client_factory(name="shop-service", scopes=WRITER),
        "admin": api_client_factory(name="template-admin", scopes=[*WRITER, "templates:admin"]),
        "only-admin": api_client_factory(name="only-admin", scopes=["send", "templates:admin"]),
        "staging": api_client_factory(name="auth-staging", scopes=WRITER, mode="test"),
        "other": api_client_factory(name="other-service", scopes=[*WRITER, "templates:admin"], project="other"),
    }


@pytest.mark.django_db
def test_two_clients_of_one_environment_share_a_template(clients: Any) -> None:
    (auth, auth_api), (shop, shop_api) = clients["auth"], clients["shop"]
    assert put(auth_api, "password_reset").status_code == 201

    # A draft by the other key, then published by it: both allowed, as for the key that made it.
    draft = put(shop_api, "password_reset", CHANGED, publish=False)
    assert draft.status_code == 201, draft.content
    assert draft.json()["version"] == 2 and draft.json()["published"] is False
    published = put(shop_api, "password_reset", CHANGED)
    assert published.status_code == 201, published.content
    shown = auth_api.get("/api/v1/templates/password_reset").json()
    assert shown["published_version"] == 3 and shown["published"]["content"] == CHANGED
    # Who made it stays who made it: changing is not taking over, and it decides nothing.
    template = Template.objects.get(key="password_reset")
    assert template.owner_client_id == auth.pk
    assert shown["owner"] == "you"
    assert shop_api.get("/api/v1/templates/password_reset").json()["owner"] == "another_client"

    entries = list(AuditEntry.objects.filter(target_type="template", target_id="password_reset").order_by("id"))
    assert [(e.actor_name, e.action) for e in entries] == [
        ("auth-service", "template.version_create"),
        ("shop-service", "template.version_create"),
        ("shop-service", "template.version_create"),
    ]
    assert entries[0].changes["owner_client_id"] == [None, auth.pk]
    assert entries[2].actor_type == "client" and entries[2].actor_id == str(shop.pk)

    # And sends it, its categories permitting.
    factories.make_recipient(user_id="u-1", email="u-1@example.com")
    sent = shop_api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": "u-1"}, "template": "password_reset", "payload": {"link": "x"}},
        format="json",
    )
    assert sent.status_code == 202, sent.content


@pytest.mark.django_db
def test_a_template_made_by_staff_is_changed_by_any_key_of_its_environment(clients: Any) -> None:
    # Made in the admin or by bootstrap_demo: no client made it.
    template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)
    _, auth_api = clients["auth"]
    assert auth_api.get("/api/v1/templates/order_shipped").json()["owner"] == "staff"
    changed = put(auth_api, "order_shipped", CHANGED)
    assert changed.status_code == 201, changed.content
    template = Template.objects.get(key="order_shipped")
    assert template.published_version.version == 2 and template.owner_client_id is None


@pytest.mark.django_db
def test_a_client_of_another_project_or_environment_does_not_see_it(clients: Any) -> None:
    (_, auth_api), (_, other_api), (_, staging_api) = clients["auth"], clients["other"], clients["staging"]
    assert put(auth_api, "password_reset").status_code == 201
    mine = Template.objects.get(key="password_reset")

    for api in (other_api, staging_api):  # another project (even with templates:admin); the same project's test
        missing = api.get("/api/v1/templates/password_reset")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "template_not_found"
        assert api.get("/api/v1/templates/password_reset/versions/1").status_code == 404
        assert "password_reset" not in {t["key"] for t in api.get("/api/v1/templates").json()["results"]}
        # The same key there is a template of its own: the first one is untouched.
        assert put(api, "password_reset", CHANGED).status_code == 201
    assert Template.objects.filter(key="password_reset").count() == 3
    mine.refresh_from_db()
    assert mine.versions.count() == 1 and mine.published_version.content == CONTENT
    assert auth_api.get("/api/v1/templates/password_reset").json()["published"]["content"] == CONTENT


@pytest.mark.django_db
def test_templates_admin_grants_nothing_more_than_templates(clients: Any) -> None:
    (_, auth_api), (_, admin_api), (_, only_admin_api) = clients["auth"], clients["admin"], clients["only-admin"]
    assert "templates:admin" in SCOPES  # kept: keys that hold it keep working
    assert put(auth_api, "password_reset").status_code == 201
    assert put(admin_api, "password_reset", CHANGED).status_code == 201  # as any key with templates
    # Without `templates` it allows nothing at all.
    for answer in (only_admin_api.get("/api/v1/templates/password_reset"), put(only_admin_api, "password_reset")):
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "scope_missing"
        assert answer.json()["error"]["fields"]["scope"] == ["templates"]
    assert Template.objects.get(key="password_reset").versions.count() == 2


@pytest.mark.django_db
def test_staff_change_a_client_made_template_and_the_admin_says_who_made_it(clients: Any, staff: Any) -> None:
    auth, auth_api = clients["auth"]
    assert put(auth_api, "password_reset").status_code == 201
    editor = factories.make_staff_user("editor", superuser=True)
    version = template_put(
        key="password_reset", category="transactional", default_locale="en", content=CHANGED, audit_actor=editor
    )
    assert version.version == 2 and Template.objects.get(key="password_reset").owner_client_id == auth.pk
    template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)
    made = staff.get(f"/admin/templates_app/template/{Template.objects.get(key='password_reset').pk}/change/")
    assert made.status_code == 200 and f"API client #{auth.pk} (over the API)".encode() in made.content
    by_staff = staff.get(f"/admin/templates_app/template/{Template.objects.get(key='order_shipped').pk}/change/")
    assert b"staff (in the admin or by a command)" in by_staff.content
    assert b"templates:admin" not in made.content + by_staff.content


@pytest.mark.django_db
def test_a_template_deleted_and_made_again_is_read_afresh_once_the_process_caches_are_forgotten() -> None:
    """Exact versions are cached per process by (environment, key, number); forget_all() drops them with the rest.

    A template deleted and made again under its key reuses version numbers (a test database truncated between
    tests does exactly that), so the cache must not outlive the rows it was filled from.
    """
    from core import config_cache
    from projects.scoping import owner_id
    from templates_app.selectors import template_version_exact

    first = template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)
    environment = owner_id(first.template)
    assert template_version_exact(environment_id=environment, key="order_shipped", version=1) == first

    Template.objects.filter(pk=first.template_id).delete()
    again = template_put(key="order_shipped", category="transactional", default_locale="en", content=CHANGED)
    assert again.version == 1

    config_cache.forget_all()
    found = template_version_exact(environment_id=environment, key="order_shipped", version=1)
    assert found is not None and found.pk == again.pk and found.content == CHANGED


@pytest.mark.django_db(transaction=True)
def test_a_template_deleted_and_made_again_is_read_afresh_once_a_lookup_sees_the_new_generation() -> None:
    """In a running process: the delete bumps the configuration generation, and the next cached lookup that reads
    it (every request and send batch makes one) empties the exact versions with the rest."""
    from core import config_cache
    from projects.scoping import owner_id
    from templates_app.selectors import template_version_cached, template_version_exact

    first = template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)
    environment = owner_id(first.template)
    assert template_version_cached("order_shipped", environment_id=environment) == first
    assert template_version_exact(environment_id=environment, key="order_shipped", version=1) == first

    Template.objects.filter(pk=first.template_id).delete()
    again = template_put(key="order_shipped", category="transactional", default_locale="en", content=CHANGED)
    assert template_version_cached("order_shipped", environment_id=environment) == again
    found = template_version_exact(environment_id=environment, key="order_shipped", version=1)
    assert found is not None and found.pk == again.pk and found.content == CHANGED
    assert config_cache.peek("template", f"{environment}:order_shipped") == again
