"""The admin for support staff: deliveries with their history and the template version they used."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from notifier.models import Delivery, FanoutLane
from notifier.services import api_client_create, notification_accept
from preferences.models import Topic
from preferences.services import recipient_upsert
from templates_app.services import template_put


@pytest.mark.django_db
def test_delivery_page_shows_events_and_links_the_template_version(client: Any) -> None:
    version = template_put(
        key="hello", category="transactional", default_locale="en", content={"en": {"sms": {"text": "Hi"}}}
    )
    recipient_upsert(user_id="u-a", phone="+14155550100")
    api_client, _ = api_client_create(name="admin-test")
    delivery = notification_accept(
        client=api_client,
        data={"recipient": {"user_id": "u-a"}, "category": "transactional", "template": "hello"},
    ).deliveries[0]
    Delivery.objects.filter(pk=delivery.pk).update(template_version=version)
    User.objects.create_superuser("support", "support@example.com", "pw")
    client.login(username="support", password="pw")
    page = client.get(f"/admin/notifier/delivery/{delivery.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f"/admin/templates_app/templateversion/{version.pk}/preview/" in html
    assert "queued" in html
    listing = client.get("/admin/notifier/delivery/")
    assert listing.status_code == 200
    assert client.get("/admin/notifier/notification/").status_code == 200
    assert client.get("/admin/notifier/apiclient/").status_code == 200
    assert client.get("/admin/notifier/deadletter/").status_code == 200
    assert client.get("/admin/notifier/dashboard/").status_code == 200
    assert client.get("/admin/channels_app/sandboxmessage/").status_code == 200


@pytest.mark.django_db
def test_a_topic_notification_page_shows_its_fanout_lanes(client: Any) -> None:
    template_put(
        key="news",
        category="marketing",
        default_locale="en",
        content={"en": {"email": {"subject": "Hi", "text": "Hi"}}},
    )
    Topic.objects.create(key="all", name="all")
    api_client, _ = api_client_create(name="admin-lanes")
    notification = notification_accept(
        client=api_client, data={"topic": "all", "category": "marketing", "template": "news"}
    ).notification
    FanoutLane.objects.create(notification=notification, lane=0, cursor=41, upper=90210, processed=41)
    FanoutLane.objects.create(notification=notification, lane=1, cursor=90210, upper=None, processed=0)
    User.objects.create_superuser("support", "support@example.com", "pw")
    client.login(username="support", password="pw")

    page = client.get(f"/admin/notifier/notification/{notification.pk}/change/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "Fanout lanes" in html or "fanout lanes" in html.lower()
    assert "90210" in html
