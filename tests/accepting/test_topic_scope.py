"""Sending to a topic needs the `topics` scope besides `send` (or `campaigns`): one request reaches everyone."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from notifier.campaigns.models import Campaign
from notifier.deliveries.models import Notification
from tests import factories
from tests.dispatch.test_fanout import make_template, make_topic

TOPIC_SEND = {"topic": "fans", "template": "spring_sale", "payload": {"pct": 10}}


@pytest.fixture
def fans(db: None) -> None:
    make_template()
    make_topic("fans", 3)


def assert_scope_missing(body: dict[str, Any], scope: str = "topics") -> None:
    error = body["error"]
    assert error["code"] == "scope_missing"
    assert scope in error["message"] and error["fields"]["scope"] == [scope]


@pytest.mark.django_db
def test_a_send_only_key_cannot_send_to_a_topic(api_client_factory: Callable[..., Any], fans: None) -> None:
    _, sender = api_client_factory(scopes=["send"])
    refused = sender.post("/api/v1/notifications", TOPIC_SEND, format="json")
    assert refused.status_code == 403, refused.content
    assert_scope_missing(refused.json())
    assert not Notification.objects.exists()

    _, broadcaster = api_client_factory(scopes=["send", "topics"])
    accepted = broadcaster.post("/api/v1/notifications", TOPIC_SEND, format="json")
    assert accepted.status_code == 202, accepted.content
    assert Notification.objects.get().topic.key == "fans"


@pytest.mark.django_db
def test_a_topic_item_of_a_batch_fails_alone(api_client_factory: Callable[..., Any], fans: None) -> None:
    _, sender = api_client_factory(scopes=["send"])
    factories.make_recipient(user_id="u-1", email="u-1@example.com")
    single = {"recipient": {"user_id": "u-1"}, "template": "spring_sale", "payload": {"pct": 10}}
    answer = sender.post("/api/v1/notifications/batch", {"notifications": [single, TOPIC_SEND]}, format="json")
    assert answer.status_code == 200
    first, second = answer.json()["results"]
    assert first["status"] == 202 and second["status"] == 403
    assert_scope_missing(second)
    assert Notification.objects.filter(topic__isnull=True).count() == 1
    assert not Notification.objects.filter(topic__isnull=False).exists()


@pytest.mark.django_db
@pytest.mark.urls("tests.campaigns.test_campaigns")
def test_campaigns_over_the_api_need_the_topics_scope(api_client_factory: Callable[..., Any], fans: None) -> None:
    body = {
        "name": "Spring",
        "template": "spring_sale",
        "topic": "fans",
        "send_at": (timezone.now() + timedelta(hours=2)).isoformat(),
    }
    _, marketer = api_client_factory(scopes=["campaigns"])
    refused = marketer.post("/api/v1/campaigns", body, format="json")
    assert refused.status_code == 403, refused.content
    assert_scope_missing(refused.json())
    assert not Campaign.objects.exists()

    owner, allowed = api_client_factory(scopes=["campaigns", "topics"])
    created = allowed.post("/api/v1/campaigns", body, format="json")
    assert created.status_code == 201, created.content
    campaign_id = created.json()["id"]

    # The same client after losing the scope may no longer change it (it would re-point the broadcast).
    owner.scopes = ["campaigns"]
    owner.save()
    changed = allowed.patch(f"/api/v1/campaigns/{campaign_id}", {"name": "Summer"}, format="json")
    assert changed.status_code == 403, changed.content
    assert_scope_missing(changed.json())
    assert Campaign.objects.get(pk=campaign_id).name == "Spring"
