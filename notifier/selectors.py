"""Reads of the core: notifications with their deliveries and events, cursor-paginated lists."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import datetime
from typing import Any

from django.db.models import Count, Prefetch, Q, QuerySet

from notifier.models import ApiClient, DeliveryEvent, Notification

DELIVERIES_IN_DETAIL = 100


def encode_cursor(values: dict[str, Any]) -> str:
    """Return an opaque cursor for keyset pagination."""
    return base64.urlsafe_b64encode(json.dumps(values, default=str).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> dict[str, Any]:
    """Decode a cursor made by `encode_cursor`; raise ValueError if it is not one."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, json.JSONDecodeError) as exc:
        raise ValueError("invalid cursor") from exc
    if not isinstance(value, dict):
        raise ValueError("invalid cursor")
    return value


def notification_get(*, client: ApiClient, notification_id: str) -> Notification | None:
    """Return the client's notification with its first deliveries (and their events) in `.first_deliveries`."""
    notification = Notification.objects.filter(client=client, pk=notification_id).select_related("topic").first()
    if notification is None:
        return None
    # A topic notification can have a million deliveries: the detail shows the first ones and the counts.
    notification.first_deliveries = list(  # type: ignore[attr-defined]
        notification.deliveries.order_by("id").prefetch_related(
            Prefetch("events", queryset=DeliveryEvent.objects.order_by("id"))
        )[:DELIVERIES_IN_DETAIL]
    )
    return notification


def notification_delivery_counts(*, notification: Notification) -> dict[str, int]:
    """Return the number of deliveries of a notification per status."""
    rows = notification.deliveries.values("status").annotate(n=Count("id")).order_by()
    return {row["status"]: row["n"] for row in rows}


def _notification_position(cursor: str) -> tuple[datetime, uuid.UUID]:
    """Return the (created_at, id) a notifications cursor points after; ValueError for anything else."""
    position = decode_cursor(cursor)
    created, last_id = position.get("c"), position.get("i")
    if not isinstance(created, str) or not isinstance(last_id, str):
        raise ValueError("invalid cursor")
    at = datetime.fromisoformat(created)  # ValueError when it is not a timestamp
    if at.tzinfo is None:
        raise ValueError("invalid cursor")
    return at, uuid.UUID(last_id)  # ValueError when it is not a UUID


def notification_list(
    *, client: ApiClient, filters: dict[str, Any], cursor: str | None, limit: int = 50
) -> tuple[list[Notification], str | None]:
    """Return a page of the client's notifications, newest first, and the cursor of the next page."""
    qs: QuerySet[Notification] = Notification.objects.filter(client=client).select_related("topic")
    if filters.get("user_id"):
        qs = qs.filter(user_id=filters["user_id"])
    if filters.get("status"):
        qs = qs.filter(status=filters["status"])
    if filters.get("category"):
        qs = qs.filter(category=filters["category"])
    if cursor:
        created, last_id = _notification_position(cursor)
        qs = qs.filter(Q(created_at__lt=created) | Q(created_at=created, id__lt=last_id))
    page = list(qs.order_by("-created_at", "-id")[: limit + 1])
    next_cursor = None
    if len(page) > limit:
        page = page[:limit]
        last = page[-1]
        next_cursor = encode_cursor({"c": last.created_at.isoformat(), "i": str(last.pk)})
    return page, next_cursor
