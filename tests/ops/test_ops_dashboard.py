"""The operators' admin dashboard: staff only, with last-hour outcomes, queues, dead letters and breakers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import path
from django.utils import timezone

from ops.dashboard import dashboard_view
from tests.factories import make_dead_letter, make_delivery_event, make_staff_user
from tests.ops.test_ops_retention import make_delivery

# The exact wiring config/urls.py needs: before admin.site.urls, wrapped in admin_view.
urlpatterns = [
    path("admin/notifier/dashboard/", admin.site.admin_view(dashboard_view), name="notifier-dashboard"),
    path("admin/", admin.site.urls),
]


@pytest.mark.urls(__name__)
@pytest.mark.django_db
def test_dashboard_requires_staff() -> None:
    """Anonymous visitors are sent to the admin login."""
    response = Client().get("/admin/notifier/dashboard/")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


@pytest.mark.urls(__name__)
@pytest.mark.django_db
def test_dashboard_shows_outcomes_queues_dead_letters_and_breakers() -> None:
    """A staff user sees per-channel counts of the last hour, queue depths, pending dead letters, breakers."""
    sent = make_delivery(channel="sms", status="sent")
    failed = make_delivery(channel="sms", status="failed")
    make_delivery_event(delivery=sent, status="sent", at=timezone.now())
    make_delivery_event(delivery=failed, status="failed", at=timezone.now())
    # An event older than the window is not counted.
    make_delivery_event(delivery=failed, status="failed", at=timezone.now() - timedelta(hours=2))
    make_dead_letter(delivery=failed, channel="sms", queue="sms.high", reason="exhausted")
    staff = make_staff_user("ops", password="x", is_superuser=True)
    client = Client()
    client.force_login(staff)

    response = client.get("/admin/notifier/dashboard/")

    assert response.status_code == 200
    context = response.context
    sms = next(row for row in context["outcomes"] if row["channel"] == "sms")
    assert sms["sent"] == 1 and sms["failed"] == 1
    assert context["broker_up"] is True
    assert "sms.high" in {q["name"] for q in context["work_queues"]}
    assert "dead.sms" in {q["name"] for q in context["dead_queues"]}
    assert dict(context["dead_letters_pending"]) == {"sms": 1}
    breakers = {b["provider"]: b["state"] for b in context["breakers"]}
    assert breakers.get("sandbox") == "closed"
    html = response.content.decode()
    assert "Operations dashboard" in html and "Circuit breakers" in html
