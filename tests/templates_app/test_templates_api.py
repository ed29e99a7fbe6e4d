"""The templates API: PUT creates versions, GET reads them, preview renders them; errors name the field."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.urls import include, path

from templates_app.models import Template, TemplateVersion

# Mounted here until the project's urlconf includes templates_app.urls under /api/v1/.
urlpatterns = [path("api/v1/", include("templates_app.urls"))]
pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]

CONTENT: dict[str, Any] = {
    "en": {
        "email": {"subject": "Order {{ order_id }} shipped", "text": "Hi {{ name }}", "html": "<p>{{ name }}</p>"},
        "push": {"title": "Shipped", "body": "Order {{ order_id }}", "data": {"order": "{{ order_id }}"}},
        "sms": {"text": "Order {{ order_id }} shipped"},
    },
    "de": {"email": {"subject": "Bestellung {{ order_id }} versandt", "text": "Hallo {{ name }}"}},
}
BODY: dict[str, Any] = {"category": "transactional", "default_locale": "en", "content": CONTENT}


def put(api: Any, key: str, body: dict[str, Any]) -> Any:
    return api.put(f"/api/v1/templates/{key}", body, format="json")


def test_put_creates_versions_and_get_shows_them(api: Any) -> None:
    first = put(api, "order_shipped", BODY)
    assert first.status_code == 201, first.json()
    assert first.json() == {"key": "order_shipped", "version": 1, "published": True}
    draft = put(api, "order_shipped", {**BODY, "publish": False})
    assert draft.status_code == 201
    assert draft.json() == {"key": "order_shipped", "version": 2, "published": False}

    got = api.get("/api/v1/templates/order_shipped")
    assert got.status_code == 200
    body = got.json()
    assert body["key"] == "order_shipped"
    assert body["category"] == "transactional"
    assert body["published_version"] == 1
    assert [v["version"] for v in body["versions"]] == [2, 1]
    assert [v["published"] for v in body["versions"]] == [False, True]
    assert body["published"]["version"] == 1
    assert body["published"]["content"] == CONTENT
    assert body["published"]["channels"] == ["email", "push", "sms"]
    assert body["versions"][0]["created_by"].startswith("api:")

    one = api.get("/api/v1/templates/order_shipped/versions/2")
    assert one.status_code == 200
    assert one.json()["content"] == CONTENT and one.json()["published"] is False


def test_unknown_template_is_404(api: Any) -> None:
    for response in (
        api.get("/api/v1/templates/nope"),
        api.post("/api/v1/templates/nope/preview", {"payload": {}}, format="json"),
        api.get("/api/v1/templates/nope/versions/1"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "template_not_found"
    put(api, "exists", BODY)
    missing = api.post("/api/v1/templates/exists/preview", {"payload": {}, "version": 7}, format="json")
    assert missing.status_code == 404


def test_requires_api_key(db: None) -> None:
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/templates/x").status_code == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**BODY, "category": "nope"}, "category"),
        ({**BODY, "default_locale": "not a locale"}, "default_locale"),
        ({**BODY, "default_locale": "fr"}, "content"),
        ({**BODY, "content": "text"}, "content"),
        ({**BODY, "content": {}}, "content"),
        ({"default_locale": "en", "content": CONTENT}, "category"),
        ({**BODY, "content": {"en": {"fax": {"text": "x"}}}}, "content.en.fax"),
        (
            {**BODY, "content": {"en": {"email": {"subject": "x", "text": "y", "footer": "z"}}}},
            "content.en.email.footer",
        ),
        ({**BODY, "content": {"en": {"email": {"subject": "{{ x", "text": "y"}}}}, "content.en.email.subject"),
        ({**BODY, "content": {"en": {"email": {"text": "y"}}}}, "content.en.email.subject"),
        ({**BODY, "content": {"en": {"email": {"subject": "s"}}}}, "content.en.email"),
        ({**BODY, "content": {"en": {"sms": {"text": 5}}}}, "content.en.sms.text"),
        ({**BODY, "content": {"en": {"push": {"title": "t", "data": {"n": 1}}}}}, "content.en.push.data.n"),
        ({**BODY, "content": {"en": {"webhook": {"body": {"a": ["{% if %}"]}}}}}, "content.en.webhook.body.a[0]"),
        ({**BODY, "content": {"en": {"sms": {"text": "{{ ''.__class__ }}"}}}}, "content.en.sms.text"),
        ({**BODY, "content": {"en": {"sms": {"text": "{% include 'x' %}"}}}}, "content.en.sms.text"),
        ({**BODY, "content": {"en": {"sms": {"text": "x"}}, "EN": {"sms": {"text": "y"}}}}, "content.EN"),
        ({**BODY, "content": {"en!": {"sms": {"text": "x"}}}}, "content.en!"),
        ({**BODY, "publish": "maybe"}, "publish"),
        ({**BODY, "content": {"en": {"sms": {"text": "a\u0000b"}}}}, "content"),
    ],
)
def test_put_validation_errors_name_the_field(api: Any, body: dict[str, Any], field: str) -> None:
    response = put(api, "bad", body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["fields"], error
    assert not Template.objects.filter(key="bad").exists()


def test_put_bad_key_is_400(api: Any) -> None:
    response = put(api, "has space", BODY)
    assert response.status_code == 400
    assert "key" in response.json()["error"]["fields"]


def test_locales_are_canonicalized(api: Any) -> None:
    body = {**BODY, "default_locale": "en_us", "content": {"en_US": CONTENT["en"], "pt_br": {"sms": {"text": "Oi"}}}}
    assert put(api, "canon", body).status_code == 201
    template = Template.objects.get(key="canon")
    assert template.default_locale == "en-US"
    assert set(template.published_version.content) == {"en-US", "pt-BR"}
    assert template.published_version.channels == ["email", "push", "sms"]


def test_default_locale_defaults_to_the_templates_own(api: Any) -> None:
    assert put(api, "dl", {**BODY, "default_locale": "de", "content": {"de": CONTENT["de"]}}).status_code == 201
    response = put(api, "dl", {"category": "transactional", "content": {"de": {"sms": {"text": "x"}}}})
    assert response.status_code == 201
    assert Template.objects.get(key="dl").default_locale == "de"


def test_draft_cannot_change_category_of_published_template(api: Any) -> None:
    put(api, "cat", BODY)
    response = put(api, "cat", {**BODY, "category": "marketing", "publish": False})
    assert response.status_code == 400
    assert "category" in response.json()["error"]["fields"]
    assert put(api, "cat", {**BODY, "category": "marketing"}).status_code == 201
    assert Template.objects.get(key="cat").category == "marketing"


def test_category_restricted_client_is_403(api_client_factory: Any) -> None:
    _, marketing_only = api_client_factory(categories=["marketing"])
    response = put(marketing_only, "promo", BODY)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "category_forbidden"
    assert put(marketing_only, "promo", {**BODY, "category": "marketing"}).status_code == 201


def test_preview_renders_every_channel(api: Any) -> None:
    put(api, "order_shipped", BODY)
    payload = {"order_id": "A-1", "name": "<Ann>"}
    response = api.post(
        "/api/v1/templates/order_shipped/preview", {"payload": payload, "locale": "de-AT"}, format="json"
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["version"] == 1 and body["published"] is True
    channels = body["channels"]
    assert set(channels) == {"email", "push", "sms"}
    assert channels["email"] == {
        "locale": "de",
        "parts": {"subject": "Bestellung A-1 versandt", "text": "Hallo <Ann>", "html": ""},
    }
    assert channels["push"] == {
        "locale": "en",
        "parts": {"title": "Shipped", "body": "Order A-1", "data": {"order": "A-1"}},
    }
    assert channels["sms"]["parts"] == {"text": "Order A-1 shipped"}


def test_preview_of_a_draft_version(api: Any) -> None:
    put(api, "t", BODY)
    put(api, "t", {**BODY, "content": {"en": {"sms": {"text": "draft {{ order_id }}"}}}, "publish": False})
    response = api.post("/api/v1/templates/t/preview", {"payload": {"order_id": "1"}, "version": 2}, format="json")
    assert response.status_code == 200
    assert response.json()["published"] is False
    sms = {"encoding": "gsm7", "units": 7, "segments": 1, "max_segments": 6, "warning": ""}
    assert response.json()["channels"] == {"sms": {"locale": "en", "parts": {"text": "draft 1"}, "sms": sms}}


def test_preview_missing_variable_is_400_naming_it(api: Any) -> None:
    put(api, "order_shipped", BODY)
    response = api.post("/api/v1/templates/order_shipped/preview", {"payload": {"order_id": "A-1"}}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "render_error"
    assert "'name'" in error["message"]
    assert "payload.name" in error["fields"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"payload": "not an object"}, "payload"),
        ({"payload": {}, "version": 0}, "version"),
        ({"payload": {}, "version": "x"}, "version"),
        ({"payload": {"name": "a\u0000b"}}, "payload"),
    ],
)
def test_preview_bad_input_is_400(api: Any, body: dict[str, Any], field: str) -> None:
    put(api, "p", BODY)
    response = api.post("/api/v1/templates/p/preview", body, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_puts_get_distinct_version_numbers() -> None:
    from templates_app.services import template_put

    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def worker() -> None:
        try:
            barrier.wait()
            for _ in range(3):
                template_put(key="race", category="transactional", default_locale="en", content=CONTENT)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    versions = sorted(TemplateVersion.objects.filter(template__key="race").values_list("version", flat=True))
    assert versions == list(range(1, 19))
    assert Template.objects.get(key="race").published_version.version == 18
