"""Reads of dead letters: a filtered, keyset-paginated list and single lookups."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from core.pagination import cursor_id, decode_cursor, encode_cursor
from notifier.clients.models import ApiClient
from notifier.deadletters.models import DeadLetter
from notifier.deliveries.models import Delivery


def _scoped(client: ApiClient | None) -> QuerySet[DeadLetter]:
    qs = DeadLetter.objects.select_related("delivery")
    if client is not None:
        qs = qs.filter(delivery__notification__client=client)
    return qs


def dead_letter_get(*, dead_letter_id: int, client: ApiClient | None = None) -> DeadLetter | None:
    """Return a dead letter (of `client`'s notifications, if given), or None."""
    return _scoped(client).filter(pk=dead_letter_id).first()


def dead_letter_list(
    *, filters: dict[str, Any], cursor: str | None, limit: int = 50, client: ApiClient | None = None
) -> tuple[list[DeadLetter], str | None]:
    """Return a page of dead letters, newest first, and the cursor of the next page.

    Raises ValueError for a cursor this API did not make, the 400 naming `cursor` for a position that is no id.
    """
    qs = _scoped(client)
    if filters.get("channel"):
        qs = qs.filter(channel=filters["channel"])
    if filters.get("status"):
        qs = qs.filter(status=filters["status"])
    if cursor:
        # An id-keyed position, as every id-keyed list reads one: a whole number within a bigint, or the 400.
        qs = qs.filter(pk__lt=cursor_id(decode_cursor(cursor)))
    page = list(qs.order_by("-pk")[: limit + 1])
    next_cursor = None
    if len(page) > limit:
        page = page[:limit]
        next_cursor = encode_cursor({"i": page[-1].pk})
    return page, next_cursor


def dead_letters_replayable(
    *, ids: list[int] | None = None, channel: str | None = None, client: ApiClient | None = None
) -> QuerySet[DeadLetter]:
    """Return the pending dead letters a replay would re-queue (their delivery is still `failed`)."""
    qs = DeadLetter.objects.filter(status=DeadLetter.Status.PENDING, delivery__status=Delivery.Status.FAILED)
    if ids is not None:
        qs = qs.filter(pk__in=ids)
    if channel:
        qs = qs.filter(channel=channel)
    if client is not None:
        qs = qs.filter(delivery__notification__client=client)
    return qs
