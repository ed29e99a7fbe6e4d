"""Writes of the in-app inbox: marking items read, which moves their deliveries to `opened`."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from notifier.deliveries.models import Delivery
from notifier.deliveries.status import transition
from notifier.inbox.selectors import READABLE_STATUSES, inbox_item_get, inbox_item_url, inbox_queryset
from notifier.inbox.tokens import inbox_token_mint
from notifier.tracking.services import click_record
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


def inbox_item_archive(*, recipient: Recipient, delivery_id: int, archived: bool = True) -> Delivery | None:
    """Archive one inbox item (it is read too, and leaves the default list) or bring it back; idempotent.

    Returns the item, or None if the recipient has no such item.
    """
    with transaction.atomic():
        ids = list(
            inbox_queryset(recipient=recipient).filter(pk=delivery_id).select_for_update().values_list("pk", flat=True)
        )
        if not ids:
            return None
        if archived:
            # An archived item is done with: counted unread it would keep a badge the list no longer explains.
            _mark_read(ids)
            Delivery.objects.filter(pk__in=ids, archived_at__isnull=True).update(
                archived_at=timezone.now(), updated_at=timezone.now()
            )
        else:
            Delivery.objects.filter(pk__in=ids).update(archived_at=None, updated_at=timezone.now())
    return inbox_item_get(recipient=recipient, delivery_id=delivery_id)


def inbox_item_click(*, recipient: Recipient, delivery_id: int) -> Delivery | None:
    """Record a click on an inbox item's action URL (a `clicked` event) and mark it read; None if no such item.

    Only an item with an action URL can be clicked; one without is returned unchanged.
    """
    item = inbox_item_get(recipient=recipient, delivery_id=delivery_id)
    if item is None:
        return None
    url = inbox_item_url(item)
    if not url:
        return item
    click_record(delivery_id=item.pk, url=url, source="inbox")
    return inbox_item_mark_read(recipient=recipient, delivery_id=delivery_id)


def inbox_token_create(*, recipient: Recipient, ttl_seconds: int) -> tuple[str, datetime]:
    """Mint a short-lived token for the recipient's inbox (signed and expiring; nothing is stored)."""
    return inbox_token_mint(recipient=recipient, ttl_seconds=ttl_seconds)
