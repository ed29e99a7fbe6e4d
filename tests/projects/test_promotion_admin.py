"""Promotion and rollback in the admin: a test environment's template, layout or workflow promoted to live after
its diff is shown, and a layout's or workflow's earlier version used again; edits stay in their own environment."""

from __future__ import annotations

import html
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from audit.models import AuditEntry
from notifier.workflows.models import Workflow
from notifier.workflows.services import workflow_put
from projects.models import Membership, Project
from projects.scoping import owner_scope
from projects.selectors import environment_of
from projects.services import project_create
from templates_app.models import Layout, Template
from templates_app.services import layout_put, template_put
from tests.factories import make_staff_user
from tests.templates_app.test_templates_admin import _form

pytestmark = pytest.mark.django_db

SHIPPED = {"en": {"email": {"subject": "Shipped {{ order_id }}", "text": "On its way"}}}
SHIPPED_V2 = {"en": {"email": {"subject": "Your order {{ order_id }} shipped", "text": "On its way"}}}
STEPS = [{"id": "mail", "type": "send", "channel": "email", "template": "order_shipped"}]
STEPS_V2 = [{"id": "wait", "type": "delay", "seconds": 60}, *STEPS]


@pytest.fixture
def envs() -> dict[str, int]:
    """The environment ids of the project `shop`."""
    project_create(slug="shop")
    return {mode: environment_of(project="shop", mode=mode).pk for mode in ("test", "live")}


def _template(environment_id: int, content: dict[str, Any] = SHIPPED) -> Template:
    with owner_scope(environment_id):
        version = template_put(key="order_shipped", category="transactional", default_locale="en", content=content)
    return version.template


def _page(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return html.unescape(response.content.decode())


def test_a_test_template_is_promoted_after_its_diff_is_shown(staff: Client, envs: dict[str, int]) -> None:
    template = _template(envs["test"])
    change_url = reverse("admin:templates_app_template_change", args=[template.pk])
    promote_url = reverse("admin:templates_app_template_promote", args=[template.pk])
    assert f'href="{promote_url}"' in _page(staff.get(change_url))

    page = _page(staff.get(promote_url))
    assert "Live has none yet" in page
    assert '+        "subject": "Shipped {{ order_id }}",' in page and 'id="confirm-promote"' in page
    assert not Template.objects.filter(environment_id=envs["live"]).exists()  # a GET changes nothing

    response = staff.post(promote_url)
    live = Template.objects.get(environment_id=envs["live"], key="order_shipped")
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:templates_app_template_change", args=[live.pk])
    assert live.published_version is not None and live.published_version.content == SHIPPED
    entry = AuditEntry.objects.get(action="template.promote")
    assert (entry.actor_name, entry.changes["test_version"]) == ("staff", [None, 1])
    assert "Nothing to promote" in _page(staff.get(promote_url))

    # Changed in test: the diff from live's version; live's own page offers no promotion.
    _template(envs["test"], SHIPPED_V2)
    page = _page(staff.get(promote_url))
    assert '-        "subject": "Shipped {{ order_id }}",' in page
    assert '+        "subject": "Your order {{ order_id }} shipped",' in page and "Live uses version 1" in page
    live_page = _page(staff.get(reverse("admin:templates_app_template_change", args=[live.pk])))
    assert "Promote to live" not in live_page
    response = staff.post(reverse("admin:templates_app_template_promote", args=[live.pk]))
    assert response.status_code == 302 and Template.objects.get(pk=live.pk).published_version.version == 1


def test_promoting_a_template_takes_the_publish_permission(envs: dict[str, int]) -> None:
    template = _template(envs["test"])
    editor = make_staff_user("editor")
    editor.user_permissions.add(*Permission.objects.filter(codename__in=["view_template", "change_template"]))
    Membership.objects.create(user=editor, project=Project.objects.get(slug="shop"), role="support")
    client = Client()
    client.force_login(editor)
    change_url = reverse("admin:templates_app_template_change", args=[template.pk])
    assert "Promote to live" not in _page(client.get(change_url))
    assert client.post(reverse("admin:templates_app_template_promote", args=[template.pk])).status_code == 403
    assert not Template.objects.filter(environment_id=envs["live"]).exists()


def test_a_layout_is_promoted_and_rolled_back_to_an_earlier_version(staff: Client, envs: dict[str, int]) -> None:
    with owner_scope(envs["test"]):
        layout = layout_put(key="brand", html="<main>{{ content }}</main>").layout
    promote_url = reverse("admin:templates_app_layout_promote", args=[layout.pk])
    assert '+  "html": "<main>{{ content }}</main>",' in _page(staff.get(promote_url))
    assert staff.post(promote_url).status_code == 302
    with owner_scope(envs["test"]):
        layout_put(key="brand", html="<main class='v2'>{{ content }}</main>")
    assert staff.post(promote_url).status_code == 302
    live = Layout.objects.get(environment_id=envs["live"], key="brand")
    assert list(live.versions.order_by("version").values_list("version", flat=True)) == [1, 2]

    rollback_url = reverse("admin:templates_app_layout_rollback", args=[live.pk, 1])
    live_page = _page(staff.get(reverse("admin:templates_app_layout_change", args=[live.pk])))
    assert f'href="{rollback_url}"' in live_page and "in use" in live_page
    page = _page(staff.get(rollback_url))
    assert '-  "html": "<main class=\'v2\'>{{ content }}</main>",' in page
    assert '+  "html": "<main>{{ content }}</main>",' in page
    assert staff.post(rollback_url).status_code == 302
    newest = live.versions.order_by("-version").first()
    assert newest is not None and (newest.version, newest.html) == (3, "<main>{{ content }}</main>")
    assert AuditEntry.objects.get(action="layout.rollback").changes["rolled_back_to"] == [None, 1]
    assert staff.get(reverse("admin:templates_app_layout_rollback", args=[live.pk, 9])).status_code == 404
    # The version in use is not rolled back to.
    current = reverse("admin:templates_app_layout_rollback", args=[live.pk, 3])
    assert "already" in _page(staff.get(current))
    assert staff.post(current).status_code == 302 and live.versions.count() == 3


def test_a_workflow_is_promoted_and_rolled_back(staff: Client, envs: dict[str, int]) -> None:
    for environment_id in envs.values():
        _template(environment_id)
    with owner_scope(envs["test"]):
        workflow = workflow_put(key="shipped_flow", category="transactional", steps=STEPS).workflow
        workflow_put(key="shipped_flow", category="transactional", steps=STEPS_V2)
    promote_url = reverse("admin:workflows_workflow_promote", args=[workflow.pk])
    assert '+      "type": "delay"' in _page(staff.get(promote_url))
    assert staff.post(promote_url).status_code == 302
    live = Workflow.objects.get(environment_id=envs["live"], key="shipped_flow")
    assert (live.latest_version, live.versions.get().steps) == (1, STEPS_V2)
    with owner_scope(envs["live"]):
        workflow_put(key="shipped_flow", category="transactional", steps=STEPS)
    rollback_url = reverse("admin:workflows_workflow_rollback", args=[live.pk, 1])
    assert f'href="{rollback_url}"' in _page(staff.get(reverse("admin:workflows_workflow_change", args=[live.pk])))
    assert '+      "type": "delay"' in _page(staff.get(rollback_url))
    assert staff.post(rollback_url).status_code == 302
    live.refresh_from_db()
    assert (live.latest_version, live.versions.get(version=3).steps) == (3, STEPS_V2)
    assert {"workflow.promote", "workflow.rollback"} <= set(AuditEntry.objects.values_list("action", flat=True))


def test_editing_a_template_or_layout_whose_key_another_environment_has_writes_its_own(
    staff: Client, envs: dict[str, int]
) -> None:
    test, live = _template(envs["test"]), _template(envs["live"])
    response = staff.post(
        reverse("admin:templates_app_template_change", args=[test.pk]), _form(test, SHIPPED_V2, description="")
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert test.versions.count() == 2 and live.versions.count() == 1
    with owner_scope(envs["test"]):
        test_layout = layout_put(key="brand", html="<main>{{ content }}</main>").layout
    with owner_scope(envs["live"]):
        live_layout = layout_put(key="brand", html="<main>{{ content }}</main>").layout
    versions = {"versions-0-id": str(test_layout.versions.get().pk), "versions-0-layout": str(test_layout.pk)}
    body = {"key": "brand", "html": "<div>{{ content }}</div>", "text": "", **_inline("versions", 1), **versions}
    response = staff.post(reverse("admin:templates_app_layout_change", args=[test_layout.pk]), body)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert test_layout.versions.count() == 2 and live_layout.versions.count() == 1


def _inline(prefix: str, existing: int) -> dict[str, str]:
    """Return the management form of an inline with `existing` rows."""
    return {
        f"{prefix}-TOTAL_FORMS": str(existing),
        f"{prefix}-INITIAL_FORMS": str(existing),
        f"{prefix}-MIN_NUM_FORMS": "0",
        f"{prefix}-MAX_NUM_FORMS": "1000",
    }
