"""The templates admin through Django's test client: edit (new versions), publish, preview."""

from __future__ import annotations

import html
import json
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import path, reverse

from audit.models import AuditEntry
from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID
from templates_app.admin_editor import field_name, part_to_text
from templates_app.models import Template, TemplateVersion
from templates_app.services import template_put
from tests.factories import make_staff_user

urlpatterns = [path("admin/", admin.site.urls)]
pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__), pytest.mark.staff_user("support")]

CONTENT: dict[str, Any] = {
    "en": {
        "email": {"subject": "Order {{ order_id }}", "text": "Hi {{ name }}", "html": "<p>Hi {{ name }}</p>"},
        "sms": {"text": "Order {{ order_id }} shipped"},
    },
    "pt": {"sms": {"text": "Pedido {{ order_id }}"}},
}


def blocks(content: dict[str, Any]) -> dict[str, str]:
    """Return the editor's block fields (c__<locale>__<channel>__<part>) for a content dict."""
    return {
        field_name(locale, channel, part): part_to_text(channel, part, value)
        for locale, channels in content.items()
        for channel, parts in channels.items()
        for part, value in parts.items()
    }


def _form(template: Template | None, content: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """Return the POST data of the template change form, with the versions inline's management form."""
    existing = template.versions.count() if template else 0
    data = {
        # A new template's project environment (the default project's live one); fixed afterwards.
        "environment": str(DEFAULT_LIVE_ENVIRONMENT_ID) if template is None else None,
        "key": template.key if template else "",
        "category": template.category if template else "transactional",
        "default_locale": template.default_locale if template else "en",
        "description": template.description if template else "",
        **(blocks(content) if content else {}),
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
    response = staff.post(reverse("admin:templates_app_template_add"), _form(None, CONTENT, key="welcome"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    template = Template.objects.get(key="welcome")
    assert template.published_version.version == 1
    assert template.published_version.content == CONTENT
    assert template.published_version.created_by == "admin:support"


def test_add_without_content_or_with_bad_content_shows_errors_beside_the_field(staff: Client) -> None:
    url = reverse("admin:templates_app_template_add")
    response = staff.post(url, _form(None, key="x"))
    assert response.status_code == 200
    # The add form starts with one empty en/email block: what it lacks is said beside its first field.
    assert "c__en__email__subject" in response.context["adminform"].form.errors
    bad = {"en": {"sms": {"text": "Hi\n{{ order_id "}}}
    response = staff.post(url, _form(None, bad, key="x"))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "syntax error on line 2" in " ".join(errors["c__en__sms__text"])
    # The message is rendered beside its field, in the field's own error list.
    assert 'id="errors-c__en__sms__text"><li>' in response.content.decode()
    bad_json = {**blocks({"en": {"sms": {"text": "Hi"}}}), "c__en__webhook__body": '{\n  "a": 1,\n}'}
    response = staff.post(url, {**_form(None, key="x"), **bad_json})
    assert "Not valid JSON on line 3" in " ".join(response.context["adminform"].form.errors["c__en__webhook__body"])
    # A budget violation the renderer can see before running (a literal bomb) is refused beside its field too.
    response = staff.post(url, _form(None, {"en": {"sms": {"text": "Hi\n{{ 'x'|center(10000000) }}"}}}, key="x"))
    budget_errors = " ".join(response.context["adminform"].form.errors["c__en__sms__text"])
    assert "over the template budget" in budget_errors and "line 2" in budget_errors
    assert not Template.objects.filter(key="x").exists()


def test_a_variable_the_default_locale_does_not_use_is_refused_beside_its_field(staff: Client) -> None:
    content = {"en": {"sms": {"text": "Hi {{ name }}"}}, "de": {"sms": {"text": "Hallo {{ nmae }}"}}}
    response = staff.post(reverse("admin:templates_app_template_add"), _form(None, content, key="x"))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "Unknown variable 'nmae'" in " ".join(errors["c__de__sms__text"])
    assert "c__en__sms__text" not in errors
    assert not Template.objects.filter(key="x").exists()


def test_add_and_remove_a_block_without_javascript(staff: Client) -> None:
    v1 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    url = reverse("admin:templates_app_template_change", args=[v1.template.pk])
    page = staff.get(url)
    assert 'name="c__pt__sms__text"' in page.content.decode()
    # Adding a block shows its (empty) fields with what is missing; nothing is saved yet.
    response = staff.post(url, _form(v1.template, CONTENT, add_locale="de", add_channel="email"))
    assert response.status_code == 200
    body = response.content.decode()
    assert 'name="c__de__email__subject"' in body
    assert "is required" in " ".join(response.context["adminform"].form.errors["c__de__email__subject"])
    assert TemplateVersion.objects.filter(template=v1.template).count() == 1
    # Filled in and saved: a new version with the block; the pt block removed at the same time.
    added = {"de": {"email": {"subject": "Bestellung {{ order_id }}", "text": "Hallo {{ name }}"}}}
    response = staff.post(url, _form(v1.template, {**CONTENT, **added}, **{"remove__pt__sms": "on"}))
    assert response.status_code == 302, response.context["adminform"].form.errors
    latest = TemplateVersion.objects.filter(template=v1.template).order_by("-version").first()
    assert latest.content == {"en": CONTENT["en"], **added}


def test_editing_creates_a_new_version_and_old_ones_stay(staff: Client) -> None:
    v1 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    url = reverse("admin:templates_app_template_change", args=[v1.template.pk])
    page = staff.get(url)
    assert page.status_code == 200
    # The form is prefilled with the latest content, block by block, and lists the versions read-only.
    form = page.context["adminform"].form
    assert form["c__en__email__subject"].value() == "Order {{ order_id }}"
    assert form["c__pt__sms__text"].value() == "Pedido {{ order_id }}"
    assert "Preview" in page.content.decode()

    changed = {**CONTENT, "en": {**CONTENT["en"], "sms": {"text": "v2 {{ order_id }}"}}}
    response = staff.post(url, _form(v1.template, changed, publish=None))
    assert response.status_code == 302
    versions = {v.version: v for v in TemplateVersion.objects.filter(template=v1.template)}
    assert set(versions) == {1, 2}
    assert versions[1].content == CONTENT
    assert versions[2].content == changed
    assert versions[2].published_at is None
    assert Template.objects.get(pk=v1.template.pk).published_version.version == 1

    # Only the description changed: no new version.
    response = staff.post(url, _form(v1.template, changed, description="Shipping mails"))
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


def test_publish_after_confirmation_and_roll_back_with_the_action(staff: Client) -> None:
    v1 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    changed = {**CONTENT, "pt": {"sms": {"text": "Pedido novo {{ order_id }}"}}}
    v2 = template_put(key="t", category="transactional", default_locale="en", content=changed, publish=False)
    confirm = staff.get(reverse("admin:templates_app_templateversion_publish", args=[v2.pk]))
    assert confirm.status_code == 200
    assert "Publish version <strong>2</strong>" in confirm.content.decode()
    assert "novo&nbsp;" in confirm.content.decode()  # the diff against the published version
    assert Template.objects.get(key="t").published_version_id == v1.pk  # asking is not doing
    response = staff.post(reverse("admin:templates_app_templateversion_publish", args=[v2.pk]))
    assert response.status_code == 302
    template = Template.objects.get(key="t")
    assert template.published_version_id == v2.pk
    assert TemplateVersion.objects.get(pk=v2.pk).published_at is not None

    entry = AuditEntry.objects.get(action="template.publish")
    assert (entry.actor_name, entry.target_id, entry.changes) == ("support", "t", {"published_version": [1, 2]})

    # Roll back to v1 with the changelist action: it asks first, then the confirmation publishes.
    response = staff.post(
        reverse("admin:templates_app_templateversion_changelist"),
        {"action": "publish_version", "_selected_action": [str(v1.pk)]},
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:templates_app_templateversion_publish", args=[v1.pk])
    assert (
        "Roll <strong>t</strong> back from version 2 to version <strong>1</strong>"
        in staff.get(response["Location"]).content.decode()
    )
    assert Template.objects.get(key="t").published_version_id == v2.pk
    staff.post(response["Location"])
    assert Template.objects.get(key="t").published_version_id == v1.pk
    # More than one selected: refused.
    staff.post(
        reverse("admin:templates_app_templateversion_changelist"),
        {"action": "publish_version", "_selected_action": [str(v1.pk), str(v2.pk)]},
    )
    assert Template.objects.get(key="t").published_version_id == v1.pk


def test_viewer_can_preview_but_not_publish() -> None:
    v1 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    v2 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT, publish=False)
    viewer = make_staff_user("viewer")
    viewer.user_permissions.add(*Permission.objects.filter(codename__in=["view_template", "view_templateversion"]))
    client = Client()
    assert client.login(username="viewer", password="pw-123456")
    assert client.get(reverse("admin:templates_app_templateversion_preview", args=[v2.pk])).status_code == 200
    assert client.post(reverse("admin:templates_app_templateversion_publish", args=[v2.pk])).status_code == 403
    assert Template.objects.get(key="t").published_version_id == v1.pk


def test_editor_without_publish_permission_saves_drafts_only() -> None:
    v1 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    editor = make_staff_user("editor")
    editor.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_template", "change_template", "view_templateversion"])
    )
    client = Client()
    assert client.login(username="editor", password="pw-123456")
    url = reverse("admin:templates_app_template_change", args=[v1.template.pk])
    assert 'name="publish"' not in client.get(url).content.decode()
    changed = {**CONTENT, "pt": {"sms": {"text": "Novo {{ order_id }}"}}}
    # A crafted "publish" is ignored: the new version stays a draft.
    response = client.post(url, _form(v1.template, changed, publish="on"))
    assert response.status_code == 302
    template = Template.objects.get(key="t")
    assert template.published_version_id == v1.pk
    assert template.versions.count() == 2
    assert AuditEntry.objects.filter(action="template.version_create", actor_name="editor").count() == 1
    assert not AuditEntry.objects.filter(action="template.publish").exists()


def test_preview_draft_renders_unsaved_content_and_names_fields_with_errors(staff: Client) -> None:
    url = reverse("admin:templates_app_template_preview_draft")
    content = {"en": {"sms": {"text": "Hi {{ name }}"}}, "de": {"email": {"subject": "Hallo {{ name }}", "text": "x"}}}
    data = {**blocks(content), "default_locale": "en", "preview_locale": "de", "preview_payload": '{"name": "Bo"}'}
    answer = staff.post(url, data).json()
    assert answer["errors"] == {}
    by_channel = {c["channel"]: c for c in answer["channels"]}
    assert by_channel["sms"]["parts"][0]["text"] == "Hi Bo"
    assert by_channel["sms"]["parts"][0]["sms"] == {"encoding": "gsm7", "units": 5, "segments": 1}
    # A missing variable and a sandbox budget violation come back beside their fields; nothing is saved.
    data["preview_payload"] = "{}"
    assert "missing variable 'name'" in str(staff.post(url, data).json()["errors"]["c__en__sms__text"])
    data["c__en__sms__text"], data["preview_payload"] = "{{ name * 1000000 }}", '{"name": "x"}'
    errors = staff.post(url, data).json()["errors"]
    assert "repetition longer than" in " ".join(errors["c__en__sms__text"])
    data["c__en__sms__text"] = "{{ name }}{% if %}"
    assert "syntax error on line 1" in str(staff.post(url, data).json()["errors"]["c__en__sms__text"])
    assert not Template.objects.exists()


def test_diff_between_any_two_versions(staff: Client) -> None:
    v1 = template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    template_put(key="t", category="transactional", default_locale="en", content={"en": {"sms": {"text": "v2"}}})
    template_put(key="t", category="transactional", default_locale="en", content={"en": {"sms": {"text": "v3!"}}})
    url = reverse("admin:templates_app_template_diff", args=[v1.template.pk])
    body = staff.get(url, {"a": 1, "b": 3}).content.decode()
    assert "Pedido" in body and "v3!" in body and ">v2<" not in body
    body = staff.get(url, {"a": 2, "b": 3}).content.decode()
    assert "Pedido" not in body and "v3!" in body
