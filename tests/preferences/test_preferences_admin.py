"""Admin pages of recipients, topics and suppressions render, and list pages show no personal data."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.urls import path

from preferences.services import topic_subscribe
from tests.factories import make_device, make_recipient, make_suppression, make_topic

urlpatterns = [path("admin/", admin.site.urls)]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


def test_admin_pages(admin_client: Any) -> None:
    r = make_recipient(user_id="u-adm", email="secret@example.com", phone="+4915112345678")
    make_device(recipient=r, token="tok-adm")
    topic = make_topic(key="news", name="News")
    topic_subscribe(topic=topic, user_ids=["u-adm", "u-2"])
    make_suppression(channel="email", address="gone@example.com", source="bounce")

    listing = admin_client.get("/admin/preferences/recipient/", {"q": "u-adm"})
    assert listing.status_code == 200 and b"u-adm" in listing.content
    assert b"secret@example.com" not in listing.content and b"+4915112345678" not in listing.content
    detail = admin_client.get(f"/admin/preferences/recipient/{r.pk}/change/")
    assert detail.status_code == 200 and b"tok-adm" in detail.content  # devices inline

    topics = admin_client.get("/admin/preferences/topic/")
    assert topics.status_code == 200 and b"news" in topics.content
    suppressions = admin_client.get("/admin/preferences/suppression/")
    assert suppressions.status_code == 200 and b"gone@example.com" not in suppressions.content
    found = admin_client.get("/admin/preferences/suppression/", {"q": "gone@example.com"})
    assert found.status_code == 200 and b"1 result" in found.content
