"""notifier.deliveries.status.deliveries_insert: a notification, its deliveries and their events in one statement."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from notifier.deliveries.models import Delivery, DeliveryEvent, Notification
from notifier.deliveries.partitions import uuid7
from notifier.deliveries.status import _events_listeners, deliveries_insert
from tests.factories import make_api_client, make_recipient


@pytest.mark.django_db
def test_one_statement_writes_the_notification_its_deliveries_in_order_and_their_first_events() -> None:
    now = timezone.now()
    recipient = make_recipient(user_id="u-one", email="one@example.com", phone="+14155550100")
    notification = Notification(
        id=uuid7(now), client=make_api_client(), category="transactional", template_key="t", priority="high",
        channels=["email", "sms", "inapp"], recipient=recipient, user_id="u-one",
    )  # fmt: skip
    plans = [
        ("email", "one@example.com", "queued", ""),
        ("sms", "+14155550100", "suppressed", "opted_out"),
        ("inapp", "u-one", "queued", ""),
    ]
    deliveries = [
        Delivery(notification=notification, recipient=recipient, channel=c, address=a, status=s, reason=r)
        for c, a, s, r in plans
    ]
    heard: list[tuple[list[tuple[int, str, str]], datetime | None]] = []

    def listener(events: list[tuple[int, str, str]], at: datetime | None) -> None:
        heard.append((events, at))

    _events_listeners.append(listener)
    try:
        with CaptureQueriesContext(connection) as queries:
            deliveries_insert(deliveries, at=now, notifications=[notification])
    finally:
        _events_listeners.remove(listener)

    # One statement writes all three tables (any other is a listener's: status events, the inbox's NOTIFY).
    writes = [q["sql"] for q in queries.captured_queries if "notifier_deliveryevent" in q["sql"]]
    assert len(writes) == 1
    assert all(f'INSERT INTO "{table}"' in writes[0] for table in ("notifier_notification", "notifier_delivery"))
    assert Notification.objects.filter(pk=notification.pk, recipient=recipient).exists()
    for delivery, (channel, address, status, reason) in zip(deliveries, plans, strict=True):
        stored = Delivery.objects.get(pk=delivery.pk)  # each instance holds its own row's id
        assert (stored.channel, stored.address, stored.status, stored.reason) == (channel, address, status, reason)
        assert not delivery._state.adding
        events: list[Any] = list(
            DeliveryEvent.objects.filter(delivery_id=delivery.pk).values_list("status", "detail", "at")
        )
        assert events == [(status, reason[:1024], now)]
    assert heard == [([(d.pk, d.status, d.reason[:1024]) for d in deliveries], now)]


@pytest.mark.django_db
def test_a_notification_without_deliveries_is_written_alone() -> None:
    notification = Notification(
        id=uuid7(), client=make_api_client(), category="transactional", template_key="t", priority="high"
    )
    deliveries_insert([], at=timezone.now(), notifications=[notification])
    assert Notification.objects.filter(pk=notification.pk).exists()
    assert not notification._state.adding
