"""Reads of event endpoints and their delivery attempts."""

from __future__ import annotations

from django.db import connection

from core import config_cache
from notifier.clients.models import ApiClient
from notifier.statusevents.models import EventAttempt, EventEndpoint


def event_endpoint_get(*, client: ApiClient) -> EventEndpoint | None:
    """Return the client's event endpoint, or None."""
    return EventEndpoint.objects.filter(client=client).first()


def event_attempts_list(
    *, endpoint: EventEndpoint, before_id: int | None = None, limit: int = 50
) -> tuple[list[EventAttempt], int | None]:
    """Return one page of the endpoint's attempts, newest first, and the id to continue before."""
    qs = EventAttempt.objects.filter(endpoint=endpoint)
    if before_id is not None:
        qs = qs.filter(pk__lt=before_id)
    rows = list(qs.order_by("-id")[: limit + 1])
    if len(rows) > limit:
        return rows[:limit], rows[limit - 1].pk
    return rows, None


def has_event_endpoint(client_id: int) -> bool:
    """Return whether the client has an active event endpoint (status events are written for it), cached.

    The send pipeline asks for every batch: a batch whose clients have none and whose deliveries are not in-app
    writes no status-event statement. An endpoint deleted with a raw delete leaves the answer true until the next
    change: harmless, the status event statement then finds none.
    """
    found = config_cache.cached(
        "endpoint", str(client_id), lambda: EventEndpoint.objects.filter(client_id=client_id, is_active=True).exists()
    )
    return bool(found)


_DUE_SQL = """
    SELECT ep.id FROM notifier_eventendpoint ep
    WHERE ep.is_active AND (ep.retry_at IS NULL OR ep.retry_at <= now())
      AND EXISTS (SELECT 1 FROM notifier_statusevent s WHERE s.endpoint_id = ep.id AND s.state = 'pending')
"""


def endpoints_due() -> list[int]:
    """Return the active endpoints whose backoff has passed and that have pending events."""
    with connection.cursor() as cursor:
        cursor.execute(_DUE_SQL)
        return [int(row[0]) for row in cursor.fetchall()]
