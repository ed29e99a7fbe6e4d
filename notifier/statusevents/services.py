"""Writes of event endpoints: create or change, rotate the signing secret, delete."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Sequence

from django.db import transaction

from audit.services import audit_record
from notifier.models import ApiClient, EventEndpoint, StatusEvent

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
