"""The template decides the category; the category caps the priority: singles, batch items and campaigns."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import include, path

from config.urls import urlpatterns as root_urlpatterns
from notifier.deliveries.models import Notification
from templates_app.services import template_put

# Campaign routes may not be mounted under /api/v1/ on every branch yet; serve them here as test_campaigns does.
urlpatterns = [path("api/v1/", include("notifier.campaigns.urls")), *root_urlpatterns]
pytestmark = [pytest.mark.urls("tests.accepting.test_policy"), pytest.mark.django_db]

CONTENT = {"en": {"inapp": {"title": "Hi", "body": "Hello {{ name }}"}}}


@pytest.fixture(autouse=True)
def templates(db: None) -> None:
    template_put(key="promo", category="marketing", default_locale="en", content=CONTENT)
    template_put(key="otp", category="security", default_locale="en", content=CONTENT)


def one(**extra: Any) -> dict[str, Any]:
    return {"recipient": {"user_id": "u-1"}, "template": "promo", "payload": {"name": "Ada"}, **extra}


def test_category_defaults_to_the_templates(api: Any) -> None:
    response = api.post("/api/v1/notifications", one(), format="json")
    assert response.status_code == 202, response.content
    notification = Notification.objects.get(pk=response.json()["id"])
    assert notification.category == "marketing" and notification.priority == "low"


def test_marketing_template_sent_as_transactional_is_refused(api: Any) -> None:
    response = api.post("/api/v1/notifications", one(category="transactional"), format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "category_mismatch" and "category" in error["fields"]
    assert Notification.objects.count() == 0
    assert api.post("/api/v1/notifications", one(category="marketing"), format="json").status_code == 202


def test_priority_above_the_category_ceiling_is_forbidden(api: Any) -> None:
    response = api.post("/api/v1/notifications", one(priority="high"), format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "priority_forbidden"
    assert response.json()["error"]["fields"] == {"priority": [response.json()["error"]["message"]]}
    normal = api.post("/api/v1/notifications", one(priority="normal"), format="json")
    assert normal.status_code == 202
    assert Notification.objects.get(pk=normal.json()["id"]).priority == "normal"
    otp = api.post("/api/v1/notifications", one(template="otp", priority="high"), format="json")
    assert otp.status_code == 202


def test_category_not_allowed_to_the_client_is_forbidden(api_client_factory: Any) -> None:
    _, http = api_client_factory(categories=["security"])
    response = http.post("/api/v1/notifications", one(), format="json")
    assert response.status_code == 403 and response.json()["error"]["code"] == "category_forbidden"


def test_batch_items_each_get_the_decision(api: Any) -> None:
    items = [one(), one(category="transactional"), one(priority="high"), one(template="otp", priority="high")]
    response = api.post("/api/v1/notifications/batch", {"notifications": items}, format="json")
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["status"] for r in results] == [202, 400, 403, 202]
    assert results[1]["error"]["code"] == "category_mismatch"
    assert results[2]["error"]["code"] == "priority_forbidden"
    assert Notification.objects.count() == 2


def test_campaigns_take_the_templates_category(api: Any) -> None:
    from preferences.services import topic_upsert

    topic_upsert(key="fans", name="Fans")
    base = {"name": "Spring", "template": "promo", "topic": "fans", "draft": True}
    mismatch = api.post("/api/v1/campaigns", {**base, "category": "transactional"}, format="json")
    assert mismatch.status_code == 400 and mismatch.json()["error"]["code"] == "category_mismatch"
    created = api.post("/api/v1/campaigns", base, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["category"] == "marketing"
    # Switching to a security template moves the campaign to that template's category.
    changed = api.patch(f"/api/v1/campaigns/{created.json()['id']}", {"template": "otp"}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["category"] == "security"
