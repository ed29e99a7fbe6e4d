"""Writes of the in-app inbox: marking items read, which moves their deliveries to `opened`."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from notifier.events import transition
from notifier.inbox.selectors import READABLE_STATUSES, inbox_item_get, inbox_queryset
from notifier.inbox.tokens import inbox_token_mint
from notifier.models import Delivery
from preferences.models import Recipient


def _mark_read(ids: list[int]) -> list[int]:
    """Stamp read_at on the unread ones among `ids` and move them to `opened` (one event each)."""
    if not ids:
        return []
    now = timezone.now()
    Delivery.objects.filter(pk__in=ids, read_at__isnull=True).update(read_at=now, updated_at=now)
    return transition(ids, to=Delivery.Status.OPENED, only_from=READABLE_STATUSES, detail="inbox:read")


def inbox_item_mark_read(*, recipient: Recipient, delivery_id: int) -> Delivery | None:
    """Mark one inbox item read (idempotent); return it, or None if the recipient has no such item."""
    with transaction.atomic():
        ids = list(
            inbox_queryset(recipient=recipient).filter(pk=delivery_id).select_for_update().values_list("pk", flat=True)
        )
        if not ids:
            return None
        _mark_read(ids)
    return inbox_item_get(recipient=recipient, delivery_id=delivery_id)


def inbox_mark_all_read(*, recipient: Recipient) -> int:
    """Mark every unread inbox item of the recipient read; return how many were marked."""
    with transaction.atomic():
        ids = list(
            inbox_queryset(recipient=recipient)
            .filter(read_at__isnull=True)
            .order_by("pk")
            .select_for_update()
            .values_list("pk", flat=True)
        )
        _mark_read(ids)
    return len(ids)


def inbox_token_create(*, recipient: Recipient, ttl_seconds: int) -> tuple[str, datetime]:
    """Mint a short-lived token for the recipient's inbox (signed and expiring; nothing is stored)."""
    return inbox_token_mint(recipient=recipient, ttl_seconds=ttl_seconds)
