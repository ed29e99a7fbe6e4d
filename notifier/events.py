"""Status transitions of deliveries, always appended to the event history in the same statement batch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from notifier.models import Delivery, DeliveryEvent


def record_events(rows: Iterable[tuple[int, str, str]], *, at: datetime | None = None) -> None:
    """Append (delivery_id, status, detail) events with one multi-row insert."""
    at = at or timezone.now()
    DeliveryEvent.objects.bulk_create(
        [DeliveryEvent(delivery_id=did, status=status, detail=detail[:1024], at=at) for did, status, detail in rows],
        batch_size=5000,
    )


def transition(
    delivery_ids: Iterable[int],
    *,
    to: str,
    detail: str = "",
    only_from: Iterable[str] | None = None,
    fields: Mapping[str, Any] | None = None,
) -> list[int]:
    """Move deliveries to status `to` (only those currently in `only_from`, if given); record one event each.

    Returns the ids that actually moved. The guard on the current status is what makes a late or repeated
    transition (a redelivered message, a replayed callback) harmless: it changes nothing the second time.
    """
    ids = list(delivery_ids)
    if not ids:
        return []
    now = timezone.now()
    with transaction.atomic():
        qs = Delivery.objects.filter(pk__in=ids)
        if only_from is not None:
            qs = qs.filter(status__in=list(only_from))
        moved = list(qs.select_for_update(skip_locked=False).values_list("pk", flat=True))
        if moved:
            Delivery.objects.filter(pk__in=moved).update(status=to, updated_at=now, **dict(fields or {}))
            record_events(((did, to, detail) for did in moved), at=now)
    return moved
