"""The admin for support staff: deliveries with their history and the template version they used."""

from __future__ import annotations

from typing import Any

import pytest

from notifier.accepting.services import notification_accept
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from preferences.services import recipient_upsert
from templates_app.services import template_put
from tests.factories import make_fanout_lane, make_staff_user, make_topic


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
    client.force_login(make_staff_user("support", superuser=True))
    page = client.get(f"/admin/deliveries/delivery/{delivery.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f"/admin/templates_app/templateversion/{version.pk}/preview/" in html
    assert "queued" in html
    listing = client.get("/admin/deliveries/delivery/")
    assert listing.status_code == 200
    assert client.get("/admin/deliveries/notification/").status_code == 200
    assert client.get("/admin/clients/apiclient/").status_code == 200
    assert client.get("/admin/deadletters/deadletter/").status_code == 200
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
    make_topic(key="all", name="all")
    api_client, _ = api_client_create(name="admin-lanes")
    notification = notification_accept(
        client=api_client, data={"topic": "all", "category": "marketing", "template": "news"}
    ).notification
    make_fanout_lane(notification=notification, lane=0, cursor=41, upper=90210, processed=41)
    make_fanout_lane(notification=notification, lane=1, cursor=90210, upper=None, processed=0)
    client.force_login(make_staff_user("support", superuser=True))

    page = client.get(f"/admin/deliveries/notification/{notification.pk}/change/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "Fanout lanes" in html or "fanout lanes" in html.lower()
    assert "90210" in html
