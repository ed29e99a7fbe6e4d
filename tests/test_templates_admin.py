"""The templates admin through Django's test client: edit (new versions), publish, preview."""

from __future__ import annotations

import html
import json
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import path, reverse

from templates_app.models import Template, TemplateVersion
from templates_app.services import template_put

urlpatterns = [path("admin/", admin.site.urls)]
pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]

CONTENT: dict[str, Any] = {
    "en": {
        "email": {"subject": "Order {{ order_id }}", "text": "Hi {{ name }}", "html": "<p>Hi {{ name }}</p>"},
        "sms": {"text": "Order {{ order_id }} shipped"},
    },
    "pt": {"sms": {"text": "Pedido {{ order_id }}"}},
}


@pytest.fixture
def staff() -> Client:
    User.objects.create_superuser("support", "support@example.com", "pw-123456")
    client = Client()
    assert client.login(username="support", password="pw-123456")
    return client


def _form(template: Template | None, **fields: Any) -> dict[str, Any]:
    """Return the POST data of the template change form, with the versions inline's management form."""
    existing = template.versions.count() if template else 0
    data = {
        "key": template.key if template else "",
        "category": template.category if template else "transactional",
        "default_locale": template.default_locale if template else "en",
        "description": template.description if template else "",
        "content": "",
        "publish": "on",
        "versions-TOTAL_FORMS": str(existing),
        "versions-INITIAL_FORMS": str(existing),
        "versions-MIN_NUM_FORMS": "0",
        "versions-MAX_NUM_FORMS": "0",
    }
    data.update(fields)
    return {k: v for k, v in data.items() if v is not None}


def test_add_template_creates_published_version(staff: Client) -> None:
    assert staff.get(reverse("admin:templates_app_template_add")).status_code == 200
    response = staff.post(
        reverse("admin:templates_app_template_add"), _form(None, key="welcome", content=json.dumps(CONTENT))
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    template = Template.objects.get(key="welcome")
    assert template.published_version.version == 1
    assert template.published_version.content == CONTENT
    assert template.published_version.created_by == "admin:support"


def test_add_without_content_or_with_bad_content_shows_errors(staff: Client) -> None:
    url = reverse("admin:templates_app_template_add")
    response = staff.post(url, _form(None, key="x"))
    assert response.status_code == 200
    assert "content" in response.context["adminform"].form.errors
    bad = {"en": {"sms": {"text": "{{ order_id "}}}
    response = staff.post(url, _form(None, key="x", content=json.dumps(bad)))
    assert response.status_code == 200
    assert "content.en.sms.text" in str(response.context["adminform"].form.errors["content"])
    response = staff.post(url, _form(None, key="x", content="{not json"))
    assert "Not valid JSON" in str(response.context["adminform"].form.errors["content"])
    assert not Template.objects.filter(key="x").exists()


def test_editing_creates_a_new_version_and_old_ones_stay(staff: Client) -> None:
    v1 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    url = reverse("admin:templates_app_template_change", args=[v1.template.pk])
    page = staff.get(url)
    assert page.status_code == 200
    # The form is prefilled with the latest content and lists the versions read-only.
    assert json.loads(page.context["adminform"].form["content"].value()) == CONTENT
    assert "Preview" in page.content.decode()

    changed = {**CONTENT, "en": {**CONTENT["en"], "sms": {"text": "v2 {{ order_id }}"}}}
    response = staff.post(url, _form(v1.template, content=json.dumps(changed), publish=None))
    assert response.status_code == 302
    versions = {v.version: v for v in TemplateVersion.objects.filter(template=v1.template)}
    assert set(versions) == {1, 2}
    assert versions[1].content == CONTENT
    assert versions[2].content == changed
    assert versions[2].published_at is None
    assert Template.objects.get(pk=v1.template.pk).published_version.version == 1

    # Only the description changed: no new version.
    response = staff.post(url, _form(v1.template, content=json.dumps(changed), description="Shipping mails"))
    assert response.status_code == 302
    assert TemplateVersion.objects.filter(template=v1.template).count() == 2
    assert Template.objects.get(pk=v1.template.pk).description == "Shipping mails"


def test_versions_cannot_be_edited_or_deleted(staff: Client) -> None:
    v1 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    change = reverse("admin:templates_app_templateversion_change", args=[v1.pk])
    assert staff.get(change).status_code == 200  # view only
    assert staff.post(change, {"content": "{}"}).status_code == 403
    assert staff.post(reverse("admin:templates_app_templateversion_delete", args=[v1.pk])).status_code == 403
    assert TemplateVersion.objects.get(pk=v1.pk).content == CONTENT


def test_preview_page_renders_every_channel(staff: Client) -> None:
    v1 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    url = reverse("admin:templates_app_templateversion_preview", args=[v1.pk])
    page = staff.get(url)
    assert page.status_code == 200
    # The sample payload is prefilled with the variables the version uses.
    assert json.loads(page.context["form"].initial["payload"]) == {"name": "", "order_id": ""}

    payload = {"order_id": "A-7", "name": "<b>Bo</b>"}
    response = staff.post(url, {"payload": json.dumps(payload), "locale": "pt-BR"})
    assert response.status_code == 200
    results = {r["channel"]: r for r in response.context["results"]}
    assert set(results) == {"email", "sms"}
    assert results["sms"]["locale"] == "pt"
    assert results["sms"]["parts"] == [{"name": "text", "text": "Pedido A-7", "html": False}]
    assert results["email"]["locale"] == "en"
    email = {p["name"]: p for p in results["email"]["parts"]}
    assert email["html"]["text"] == "<p>Hi &lt;b&gt;Bo&lt;/b&gt;</p>"
    assert email["html"]["html"] is True
    assert email["text"]["text"] == "Hi <b>Bo</b>"
    body = response.content.decode()
    assert '<iframe sandbox=""' in body
    # The rendered payload never reaches the admin page unescaped.
    assert "<b>Bo</b>" not in body
    assert html.escape("Hi <b>Bo</b>") in body


def test_preview_page_shows_render_error(staff: Client) -> None:
    v1 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    url = reverse("admin:templates_app_templateversion_preview", args=[v1.pk])
    response = staff.post(url, {"payload": json.dumps({"order_id": "A-7"}), "locale": "en"})
    assert response.status_code == 200
    assert "'name'" in response.context["error"]
    assert 'id="render-error"' in response.content.decode()
    response = staff.post(url, {"payload": "[1, 2]", "locale": ""})
    assert "payload" in response.context["form"].errors


def test_publish_from_preview_page_and_action(staff: Client) -> None:
    v1 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    v2 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT, publish=False)
    response = staff.post(reverse("admin:templates_app_templateversion_publish", args=[v2.pk]))
    assert response.status_code == 302
    template = Template.objects.get(key="t")
    assert template.published_version_id == v2.pk
    assert TemplateVersion.objects.get(pk=v2.pk).published_at is not None

    # Roll back to v1 with the changelist action.
    response = staff.post(
        reverse("admin:templates_app_templateversion_changelist"),
        {"action": "publish_version", "_selected_action": [str(v1.pk)]},
    )
    assert response.status_code == 302
    assert Template.objects.get(key="t").published_version_id == v1.pk
    # More than one selected: refused.
    staff.post(
        reverse("admin:templates_app_templateversion_changelist"),
        {"action": "publish_version", "_selected_action": [str(v1.pk), str(v2.pk)]},
    )
    assert Template.objects.get(key="t").published_version_id == v1.pk
    assert staff.get(reverse("admin:templates_app_templateversion_publish", args=[v2.pk])).status_code == 405


def test_viewer_can_preview_but_not_publish() -> None:
    v1 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    v2 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT, publish=False)
    viewer = User.objects.create_user("viewer", password="pw-123456", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(codename__in=["view_template", "view_templateversion"]))
    client = Client()
    assert client.login(username="viewer", password="pw-123456")
    assert client.get(reverse("admin:templates_app_templateversion_preview", args=[v2.pk])).status_code == 200
    assert client.post(reverse("admin:templates_app_templateversion_publish", args=[v2.pk])).status_code == 403
    assert Template.objects.get(key="t").published_version_id == v1.pk
