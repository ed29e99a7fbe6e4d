"""Email layouts: versioned over the API and audited, named by templates or categories, CSS inlined, text derived."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from audit.models import AuditEntry
from channels_app.models import SandboxMessage
from notifier.deliveries.models import Delivery
from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID
from templates_app.layouts import html_to_text
from templates_app.models import LayoutVersion
from templates_app.services import layout_put, template_put
from tests.conftest import wait_for

LAYOUT_HTML = (
    "<html><head><style>.brand { color: #0a5; font-weight: bold } p { margin: 0 0 12px }"
    " a { color: #c00 }</style></head><body><div class='brand'>ACME {{ brand_line | default('') }}</div>"
    "{{ content }}<p class='foot'>ACME Inc.</p></body></html>"
)
LAYOUT_TEXT = "ACME\n\n{{ content }}\n\n-- ACME Inc."
EMAIL = {"subject": "Order {{ order_id }}", "html": "<p>Order <b>{{ order_id }}</b> is on its way.</p>"}


def put_layout(api: Any, key: str, body: dict[str, Any]) -> Any:
    return api.put(f"/api/v1/layouts/{key}", body, format="json")


def put_template(api: Any, key: str, email: dict[str, Any], **more: Any) -> Any:
    body = {"category": "transactional", "content": {"en": {"email": email}}, **more}
    return api.put(f"/api/v1/templates/{key}", body, format="json")


def preview_email(api: Any, key: str, payload: dict[str, Any]) -> dict[str, str]:
    response = api.post(f"/api/v1/templates/{key}/preview", {"payload": payload}, format="json")
    assert response.status_code == 200, response.content
    return response.json()["channels"]["email"]["parts"]


@pytest.mark.django_db
def test_put_creates_versions_get_shows_the_newest_and_both_are_audited(api: Any) -> None:
    first = put_layout(api, "brand", {"html": LAYOUT_HTML})
    assert first.status_code == 201, first.content
    assert first.json() == {"key": "brand", "version": 1}
    second = put_layout(api, "brand", {"html": LAYOUT_HTML.replace("ACME Inc.", "ACME GmbH"), "text": LAYOUT_TEXT})
    assert second.status_code == 201 and second.json()["version"] == 2
    body = api.get("/api/v1/layouts/brand").json()
    assert body["version"] == 2 and "ACME GmbH" in body["html"] and body["text"] == LAYOUT_TEXT
    assert [v["version"] for v in body["versions"]] == [2, 1]
    entries = AuditEntry.objects.filter(action="layout.version_create", target_id="brand").order_by("id")
    assert [e.changes["version"] for e in entries] == [[None, 1], [1, 2]]
    assert LayoutVersion.objects.filter(layout__key="brand").count() == 2


@pytest.mark.django_db
def test_unknown_layout_is_404(api: Any) -> None:
    response = api.get("/api/v1/layouts/nope")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "layout_not_found"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({"html": "<html><body>no slot</body></html>"}, "html", "{{ content }}"),
        ({"html": "<p>{{ content </p>"}, "html", "syntax error"),
        ({"html": "<p>{{ content }}</p>", "text": "no slot"}, "text", "{{ content }}"),
        ({"text": "{{ content }}"}, "html", "required"),
        ({"html": "{% include 'x' %}{{ content }}"}, "html", "not allowed"),
    ],
)
def test_bad_layouts_are_400_naming_the_field(api: Any, body: dict[str, Any], field: str, reason: str) -> None:
    response = put_layout(api, "brand", body)
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert field in fields and reason in " ".join(fields[field]), fields
    assert not LayoutVersion.objects.exists()


@pytest.mark.django_db
def test_a_layout_over_the_template_budget_is_refused_or_fails_alone(api: Any) -> None:
    # A loop that would print far more than a message may hold: refused at PUT, or failing its own render.
    hostile = "{% for i in range(100000000) %}xxxxxxxxxx{% endfor %}{{ content }}"
    response = put_layout(api, "huge", {"html": hostile})
    if response.status_code == 400:
        assert "html" in response.json()["error"]["fields"]
        return
    assert response.status_code == 201
    assert put_template(api, "t_huge", EMAIL, layout="huge").status_code == 201
    preview = api.post("/api/v1/templates/t_huge/preview", {"payload": {"order_id": "1"}}, format="json")
    assert preview.status_code == 400
    assert preview.json()["error"]["code"] == "template_budget"


@pytest.mark.django_db
def test_layouts_need_the_templates_scope(api_client_factory: Any) -> None:
    _, http = api_client_factory(scopes=["send"])
    response = put_layout(http, "brand", {"html": LAYOUT_HTML})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "scope_missing"


@pytest.mark.django_db
def test_a_template_naming_an_unknown_layout_is_400(api: Any) -> None:
    response = put_template(api, "t", EMAIL, layout="nope")
    assert response.status_code == 400
    assert "layout" in response.json()["error"]["fields"]


@pytest.mark.django_db
def test_preview_shows_the_laid_out_email_with_css_inlined_and_a_derived_text(api: Any) -> None:
    assert put_layout(api, "brand", {"html": LAYOUT_HTML}).status_code == 201
    response = put_template(api, "shipped", EMAIL, layout="brand")
    assert response.status_code == 201, response.content
    assert api.get("/api/v1/templates/shipped").json()["published"]["layout"] == "brand"
    parts = preview_email(api, "shipped", {"order_id": "<A-1>", "brand_line": "Shop"})
    html_out = parts["html"]
    assert "<style" not in html_out
    assert re.search(r'<div class="brand" style="color: #0a5;\s*font-weight: bold;?">ACME Shop</div>', html_out)
    # The template's HTML sits in {{ content }}, escaped once (the payload), not twice (the content itself).
    assert re.search(r'<p style="margin: 0 0 12px;?">Order <b>&lt;A-1&gt;</b> is on its way.</p>', html_out)
    assert html_out.index("ACME Shop") < html_out.index("Order") < html_out.index("ACME Inc.")
    # No text part in the template: derived from the laid-out HTML.
    assert parts["text"] == "ACME Shop\n\nOrder <A-1> is on its way.\n\nACME Inc."


@pytest.mark.django_db
def test_the_layouts_text_wraps_the_templates_text(api: Any) -> None:
    layout_put(key="brand", html=LAYOUT_HTML, text=LAYOUT_TEXT)
    put_template(api, "with_text", {**EMAIL, "text": "Order {{ order_id }} shipped."}, layout="brand")
    put_template(api, "no_text", EMAIL, layout="brand")
    assert preview_email(api, "with_text", {"order_id": "7"})["text"] == "ACME\n\nOrder 7 shipped.\n\n-- ACME Inc."
    assert preview_email(api, "no_text", {"order_id": "7"})["text"] == "ACME\n\nOrder 7 is on its way.\n\n-- ACME Inc."


@pytest.mark.django_db
def test_a_category_default_layout_applies_and_a_new_layout_version_is_used_at_once(api: Any, settings: Any) -> None:
    categories = {name: dict(rules) for name, rules in settings.NOTIFIER_CATEGORIES.items()}
    categories["transactional"]["layout"] = "house"
    settings.NOTIFIER_CATEGORIES = categories
    layout_put(key="house", html="<div>HOUSE</div>{{ content }}")
    put_template(api, "plain", EMAIL)
    assert preview_email(api, "plain", {"order_id": "1"})["html"].startswith("<html><head></head><body><div>HOUSE")
    layout_put(key="house", html="<div>HOUSE v2</div>{{ content }}")
    assert "HOUSE v2" in preview_email(api, "plain", {"order_id": "1"})["html"]


@pytest.mark.django_db
def test_templates_without_a_layout_are_unchanged(api: Any) -> None:
    put_template(api, "bare", EMAIL)
    parts = preview_email(api, "bare", {"order_id": "1"})
    assert parts["html"] == "<p>Order <b>1</b> is on its way.</p>" and parts["text"] == ""


@pytest.mark.django_db
def test_a_missing_layout_variable_is_a_400_naming_it(api: Any) -> None:
    layout_put(key="strict", html="<p>{{ footer_note }}</p>{{ content }}")
    put_template(api, "t", EMAIL, layout="strict")
    response = api.post("/api/v1/templates/t/preview", {"payload": {"order_id": "1"}}, format="json")
    assert response.status_code == 400
    assert "payload.footer_note" in response.json()["error"]["fields"]


@pytest.mark.django_db
def test_remote_stylesheets_are_never_fetched(api: Any) -> None:
    # The guard's decision as data: the link is dropped, nothing is fetched (an attempt would raise here).
    layout_put(key="remote", html='<link rel="stylesheet" href="http://169.254.169.254/x.css">{{ content }}')
    put_template(api, "t", EMAIL, layout="remote")
    html_out = preview_email(api, "t", {"order_id": "1"})["html"]
    assert "169.254.169.254" not in html_out and "Order <b>1</b>" in html_out


@pytest.mark.pure
def test_html_to_text() -> None:
    html_in = (
        "<html><head><title>T</title><style>p{x:y}</style></head><body><h1>Hi&nbsp;there</h1>"
        "<p>Read <a href='https://e.example/a'>the news</a> or <a href='https://e.example/b'>https://e.example/b</a>."
        "</p><ul><li>one</li><li>two</li></ul><p>line<br>break</p><img alt='logo' src='x'></body></html>"
    )
    assert html_to_text(html_in) == (
        "Hi\xa0there\n\nRead the news (https://e.example/a) or https://e.example/b.\n\n- one\n- two\n\nline\nbreak\n\n"
        "logo"
    )
    assert html_to_text("") == ""


def test_admin_preview_shows_the_laid_out_email(staff: Client) -> None:
    layout_put(key="brand", html=LAYOUT_HTML)
    version = template_put(
        key="t", category="transactional", default_locale="en", content={"en": {"email": EMAIL}}, layout="brand"
    )
    url = reverse("admin:templates_app_templateversion_preview", args=[version.pk])
    response = staff.post(url, {"payload": json.dumps({"order_id": "A-7"}), "locale": "en"})
    assert response.status_code == 200
    email = {p["name"]: p for p in response.context["results"][0]["parts"]}
    assert "ACME" in email["html"]["text"] and "<style" not in email["html"]["text"]
    assert 'class="brand" style="color: #0a5' in email["html"]["text"]
    assert email["text"]["text"].startswith("ACME")


def test_admin_saves_a_layout_as_a_new_audited_version(staff: Client) -> None:
    add = reverse("admin:templates_app_layout_add")
    inline = {"versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0"}
    inline["environment"] = str(DEFAULT_LIVE_ENVIRONMENT_ID)  # a new layout's project environment
    response = staff.post(add, {"key": "brand", "html": "<p>{{ content }}</p>", "text": "", **inline})
    assert response.status_code == 302, response.context["adminform"].form.errors
    bad = staff.post(add, {"key": "other", "html": "<p>no slot</p>", "text": "", **inline})
    assert bad.status_code == 200 and "{{ content }}" in bad.content.decode()
    version = LayoutVersion.objects.get(layout__key="brand")
    assert version.version == 1 and version.created_by.startswith("admin:")
    assert AuditEntry.objects.filter(action="layout.version_create", target_id="brand").exists()


TRACKED_CATEGORIES = {
    "transactional": {"priority": "high", "max_priority": "high", "optional": False, "quiet_hours": False},
    "marketing": {
        "priority": "normal",
        "max_priority": "normal",
        "optional": True,
        "quiet_hours": False,
        "track": {"clicks": True},
    },
}


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_worker_sends_the_laid_out_email_with_css_inlined_and_the_templates_links_tracked(
    api: Any, start_worker: Any, settings: Any
) -> None:
    settings.NOTIFIER_CATEGORIES = TRACKED_CATEGORIES
    settings.PUBLIC_BASE_URL = "https://notify.example.com"
    layout_put(key="brand", html=LAYOUT_HTML)
    template_put(
        key="promo",
        category="marketing",
        default_locale="en",
        layout="brand",
        content={
            "en": {"email": {"subject": "Sale", "html": '<p>Big <a href="https://shop.example.com/sale">sale</a></p>'}}
        },
    )
    assert api.put("/api/v1/recipients/lay-1", {"email": "lay-1@example.com"}, format="json").status_code in (200, 201)
    start_worker(
        env={"NOTIFIER_CATEGORIES": json.dumps(TRACKED_CATEGORIES), "PUBLIC_BASE_URL": "https://notify.example.com"}
    )
    body = {"recipient": {"user_id": "lay-1"}, "template": "promo", "category": "marketing", "channels": ["email"]}
    response = api.post("/api/v1/notifications", body, format="json")
    assert response.status_code == 202, response.content
    delivery_id = response.json()["deliveries"][0]["id"]
    wait_for(lambda: Delivery.objects.filter(pk=delivery_id, status="sent").exists(), timeout=60)
    sent = SandboxMessage.objects.get(delivery_id=delivery_id).content
    html_out = sent["html"]
    assert "<style" not in html_out and 'class="brand" style="color: #0a5' in html_out
    links = re.findall(r'<a href="([^"]+)" style="color: #c00;?">sale</a>', html_out)
    assert len(links) == 1 and links[0].startswith("https://notify.example.com/t/c/"), html_out
    assert "shop.example.com" not in html_out  # only the signed redirect carries it, encoded in its token
    assert sent["text"].startswith("ACME") and "Big sale (https://shop.example.com/sale)" in sent["text"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_template_editor_previews_and_saves_the_email_in_its_layout(
    live_server: Any, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select

    from templates_app.models import Template
    from tests.browser import login, staff_user, submit, wait

    staff_user("sue", "support", monkeypatch)
    layout_put(key="brand", html=LAYOUT_HTML)
    version = template_put(
        key="shipped", category="transactional", default_locale="en", content={"en": {"email": EMAIL}}, layout="brand"
    )
    login(browser, live_server.url, "sue")
    browser.get(f"{live_server.url}/admin/templates_app/template/{version.template_id}/change/")
    wait(browser).until(ec.presence_of_element_located((By.ID, "tpl-editor")))
    assert Select(browser.find_element(By.NAME, "layout")).first_selected_option.get_attribute("value") == "brand"

    def preview_html() -> str:
        area = browser.find_element(By.ID, "preview_payload")
        area.clear()
        area.send_keys('{"order_id": "A-7"}')
        browser.find_element(By.ID, "preview-button").click()

        def shown(driver: Any) -> str:
            parts = driver.find_elements(By.CSS_SELECTOR, 'pre.preview-part[data-part="email.html"]')
            text = parts[0].text if parts else ""
            return text if "A-7" in text else ""

        return str(wait(browser).until(shown))

    laid_out = preview_html()
    assert "ACME" in laid_out and 'class="brand" style="color: #0a5' in laid_out and "<style" not in laid_out
    # Without a layout the preview is the template's HTML alone; saving records the choice in a new version.
    Select(browser.find_element(By.NAME, "layout")).select_by_value("")
    wait(browser).until(lambda d: "ACME" not in preview_html())
    submit(browser, browser.find_element(By.NAME, "_continue"))
    wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, ".messagelist")))
    latest = Template.objects.get(key="shipped").versions.order_by("-version").first()
    assert latest is not None and (latest.version, latest.layout) == (2, "")
