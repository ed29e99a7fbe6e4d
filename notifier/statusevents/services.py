"""Writes of event endpoints: create or change, rotate the signing secret, delete."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Min

from audit.services import audit_record
from core.db import limit_maintenance_transaction
from notifier.clients.models import ApiClient
from notifier.deliveries.models import Delivery
from notifier.statusevents.models import EventEndpoint, StatusEvent
from preferences.models import Recipient

SECRET_PREFIX = "whsec_"


def _new_secret() -> str:
    """Return a fresh Standard Webhooks secret: "whsec_" and 24 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def event_endpoint_put(
    *, client: ApiClient, url: str, statuses: Sequence[str], max_batch: int
) -> tuple[EventEndpoint, str | None]:
    """Create or replace the client's event endpoint; return it and its secret if it was just created."""
    with transaction.atomic():
        endpoint = EventEndpoint.objects.select_for_update().filter(client=client).first()
        secret: str | None = None
        before = {}
        if endpoint is None:
            secret = _new_secret()
            endpoint = EventEndpoint(client=client, secret=secret)
        else:
            before = {"url": endpoint.url, "events": endpoint.statuses, "max_batch": endpoint.max_batch}
        endpoint.url = url
        endpoint.statuses = list(statuses)
        endpoint.max_batch = max_batch
        endpoint.is_active = True
        # A changed address gets a fresh start rather than the old one's backoff.
        endpoint.failures, endpoint.retry_at = 0, None
        endpoint.save()
        after = {"url": url, "events": list(statuses), "max_batch": max_batch}
        audit_record(
            actor=client,
            action="event_endpoint.create" if secret else "event_endpoint.update",
            target_type="event_endpoint",
            target_id=client.pk,
            changes={k: [before.get(k), v] for k, v in after.items() if before.get(k) != v},
        )
    return endpoint, secret


def event_endpoint_rotate_secret(*, endpoint: EventEndpoint) -> str:
    """Give the endpoint a new signing secret (effective for the next request) and return it."""
    secret = _new_secret()
    EventEndpoint.objects.filter(pk=endpoint.pk).update(secret=secret)
    audit_record(
        actor=endpoint.client,
        action="event_endpoint.rotate_secret",
        target_type="event_endpoint",
        target_id=endpoint.client_id,
    )
    return secret


def event_endpoint_delete(*, client: ApiClient) -> bool:
    """Delete the client's endpoint and the events still owed to it; return whether there was one."""
    with transaction.atomic():
        endpoint = EventEndpoint.objects.filter(client=client).first()
        if endpoint is None:
            return False
        # Raw deletes: the ORM would load every pending event to cascade it.
        StatusEvent.objects.filter(endpoint_id=endpoint.pk)._raw_delete(StatusEvent.objects.db)
        endpoint.attempts.all()._raw_delete(StatusEvent.objects.db)
        EventEndpoint.objects.filter(pk=endpoint.pk)._raw_delete(StatusEvent.objects.db)
        audit_record(actor=client, action="event_endpoint.delete", target_type="event_endpoint", target_id=client.pk)
    return True


def status_events_forget_recipient(*, recipient: Recipient, **_signal: Any) -> None:
    """Blank the user_id in the data of the status events about an erased recipient's deliveries."""
    first = Delivery.objects.filter(recipient=recipient).aggregate(first=Min("created_at"))["first"]
    if first is None:
        return
    # Status events carry the notification's user_id in their data; `at` bounds the scan (BRIN on `at`),
    # with a margin: an event's time is taken by its writer, not the delivery row's insert.
    with connection.cursor() as cursor:
        cursor.execute(
            'UPDATE notifier_statusevent SET data = data || \'{"user_id": ""}\'::jsonb'
            " WHERE at >= %s AND delivery_id IN (SELECT id FROM notifier_delivery WHERE recipient_id = %s)"
            " AND data ? 'user_id' AND data->>'user_id' <> ''",
            [first - timedelta(days=1), recipient.pk],
        )


def status_events_purge_batch(cutoff: datetime, batch: int) -> int:
    """Delete one batch of sent or given-up status events, and of event attempts, older than the cutoff."""
    done = 0
    with transaction.atomic():
        limit_maintenance_transaction()
        with connection.cursor() as cursor:
            # Pending events stay whatever their age: the sender gives them up (with a record) after its window.
            cursor.execute(
                "DELETE FROM notifier_statusevent WHERE id IN (SELECT id FROM notifier_statusevent"
                " WHERE at < %s AND state <> 'pending' ORDER BY id LIMIT %s)",
                [cutoff, batch],
            )
            done += cursor.rowcount
            cursor.execute(
                "DELETE FROM notifier_eventattempt WHERE id IN (SELECT id FROM notifier_eventattempt"
                " WHERE at < %s ORDER BY id LIMIT %s)",
                [cutoff, batch],
            )
            done = max(done, cursor.rowcount)
    return done
