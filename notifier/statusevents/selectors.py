"""Reads of event endpoints and their delivery attempts."""

from __future__ import annotations

from notifier.models import ApiClient, EventAttempt, EventEndpoint


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
