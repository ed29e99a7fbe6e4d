"""Retention: old finished deliveries and their events go, in batches; recent or unfinished ones stay."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from notifier.deadletters.models import DeadLetter
from notifier.deliveries import partitions
from notifier.deliveries.models import Delivery, DeliveryEvent, Notification
from ops.retention import purge_old_deliveries, retention_purge
from tests.factories import (
    make_api_client,
    make_dead_letter,
    make_delivery,
    make_delivery_event,
    make_event_attempt,
    make_event_endpoint,
    make_status_event,
)


def backdate(model: Any, ids: list[Any], days: int) -> None:
    """Move rows' created_at into the past with a plain UPDATE (auto_now_add cannot be set through the ORM).

    Notifications are partitioned by created_at: the past day gets its partition first (deliveries keep theirs,
    their partition key is the id).
    """
    if model is Notification:
        partitions.create_partition(partitions.NOTIFICATION, (timezone.now() - timedelta(days=days)).date())
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {model._meta.db_table} SET created_at = now() - make_interval(days => %s) WHERE id = ANY(%s)",
            [days, ids],
        )


def add_events(delivery: Delivery, *statuses: str) -> None:
    """Append events to a delivery's history."""
    for status in statuses:
        make_delivery_event(delivery=delivery, status=status, at=timezone.now())


@pytest.mark.django_db
def test_purge_removes_old_finished_deliveries_and_keeps_the_rest() -> None:
    """Old finished deliveries (and events) are deleted in batches; recent, waiting or dead-lettered stay."""
    old_sent = [make_delivery(status=s) for s in ("sent", "delivered", "failed", "bounced", "suppressed")]
    for d in old_sent:
        add_events(d, "queued", "sending", d.status)
    old_waiting = make_delivery(status="scheduled")  # due far in the future: kept whatever its age
    old_dead = make_delivery(status="failed")  # an operator still has to look at it
    make_dead_letter(delivery=old_dead, channel="email", queue="email.high", reason="exhausted")
    recent = make_delivery(status="sent")
    add_events(recent, "queued", "sent")
    backdate(Delivery, [d.id for d in [*old_sent, old_waiting, old_dead]], days=40)

    result = retention_purge(older_than_days=30, batch=2)

    assert result["deliveries"] == 5
    assert result["events"] == 15
    assert result["batches"] >= 3  # 5 rows in batches of 2
    assert result["finished"] is True
    remaining = set(Delivery.objects.values_list("id", flat=True))
    assert remaining == {old_waiting.id, old_dead.id, recent.id}
    assert not DeliveryEvent.objects.filter(delivery_id__in=[d.id for d in old_sent]).exists()
    assert DeliveryEvent.objects.filter(delivery=recent).count() == 2
    assert DeadLetter.objects.filter(delivery=old_dead).exists()
    # A second run finds nothing more.
    assert retention_purge(older_than_days=30, batch=2)["deliveries"] == 0


@pytest.mark.django_db
def test_old_notifications_without_deliveries_go_too() -> None:
    """Once its deliveries are purged, an old notification is removed; one with a delivery left stays."""
    gone = make_delivery(status="sent")
    kept = make_delivery(status="queued")
    backdate(Delivery, [gone.id, kept.id], days=40)
    backdate(Notification, [gone.notification_id, kept.notification_id], days=40)

    result = retention_purge(older_than_days=30)

    assert result["notifications"] == 1
    # any_day: backdating moved created_at away from the time in the UUIDv7 id (notifier/deliveries/partitions.py).
    assert not Notification.objects.any_day().filter(pk=gone.notification_id).exists()
    assert Notification.objects.any_day().filter(pk=kept.notification_id).exists()


@pytest.mark.django_db
def test_a_time_budget_stops_the_run_and_the_next_run_continues() -> None:
    """With the budget spent the run stops unfinished; nothing is lost, the next run removes the rest."""
    old = [make_delivery(status="sent") for _ in range(3)]
    backdate(Delivery, [d.id for d in old], days=40)
    first = retention_purge(older_than_days=30, batch=1, max_seconds=1e-9)
    assert first["finished"] is False
    second = retention_purge(older_than_days=30, batch=1)
    assert first["deliveries"] + second["deliveries"] == 3
    assert not Delivery.objects.filter(pk__in=[d.id for d in old]).exists()


@pytest.mark.django_db
def test_celery_task_uses_the_configured_age(settings: Any) -> None:
    """The beat task reads RETENTION_DAYS; 0 turns retention off."""
    settings.RETENTION_DAYS = 10
    d = make_delivery(status="sent")
    backdate(Delivery, [d.id], days=11)
    settings.RETENTION_DAYS = 0
    assert purge_old_deliveries.apply().get() is None
    assert Delivery.objects.filter(pk=d.id).exists()
    settings.RETENTION_DAYS = 10
    assert (purge_old_deliveries.apply().get() or {})["deliveries"] == 1
    assert not Delivery.objects.filter(pk=d.id).exists()


@pytest.mark.pure
def test_rejects_nonsense_arguments() -> None:
    """An age under one day would delete live traffic: refused."""
    with pytest.raises(ValueError):
        retention_purge(older_than_days=0)
    with pytest.raises(ValueError):
        retention_purge(older_than_days=30, batch=0)


@pytest.mark.django_db
def test_old_status_events_go_once_sent_or_given_up_and_pending_ones_stay() -> None:
    """Status events owed to calling services: sent or given-up old ones and old attempts go; pending stay."""
    from datetime import timedelta

    from notifier.statusevents.models import EventAttempt, StatusEvent

    client = make_api_client(name="svc-ret", key_prefix="r", key_hash="r" * 64)
    endpoint = make_event_endpoint(client=client, url="https://e.example.com", secret="whsec_eA==")
    old, new = timezone.now() - timedelta(days=40), timezone.now()

    def event(state: str, at: Any) -> StatusEvent:
        return make_status_event(endpoint=endpoint, delivery_id=1, type="delivery.sent", data={}, at=at, state=state)

    gone = [event("delivered", old), event("given_up", old)]
    kept = [event("pending", old), event("delivered", new)]
    attempt = {"first_event_id": 1, "last_event_id": 1, "events": 1, "ok": True}
    make_event_attempt(endpoint=endpoint, at=old, **attempt)
    recent_attempt = make_event_attempt(endpoint=endpoint, at=new, **attempt)

    result = retention_purge(older_than_days=30, batch=1)

    assert result["status_events"] >= 2
    assert set(StatusEvent.objects.values_list("id", flat=True)) == {e.id for e in kept}
    assert not StatusEvent.objects.filter(id__in=[e.id for e in gone]).exists()
    assert list(EventAttempt.objects.values_list("id", flat=True)) == [recent_attempt.id]
