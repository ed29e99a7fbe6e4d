"""Status transitions of deliveries, always appended to the event history in the same statement batch."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.db import bound_cursor, int_array, json_rows
from notifier.models import Delivery
from notifier.reach import reach_record

TransitionListener = Callable[[list[int], str], None]
_transition_listeners: list[TransitionListener] = []


def on_transition(listener: TransitionListener) -> TransitionListener:
    """Register `listener(moved_ids, to_status)`, called after every `transition` that moved rows."""
    if listener not in _transition_listeners:
        _transition_listeners.append(listener)
    return listener


def record_events(rows: Iterable[tuple[int, str, str]], *, at: datetime | None = None, reach: bool = True) -> None:
    """Append (delivery_id, status, detail) events with one INSERT … SELECT, however many.

    `reach=False` skips the status events and inbox notifications (notifier/reach.py): for a caller that knows
    none of these deliveries is in-app and none of their clients has an event endpoint (the send pipeline
    decides it once per batch).
    """
    ids: list[int] = []
    statuses: list[str] = []
    details: list[str] = []
    for delivery_id, status, detail in rows:
        ids.append(delivery_id)
        statuses.append(status)
        details.append(detail[:1024])
    if not ids:
        return
    # Status and detail are usually the same for the whole batch: send them once rather than as arrays.
    same = all(s == statuses[0] for s in statuses) and all(d == details[0] for d in details)
    with bound_cursor() as cursor:
        if same:
            cursor.execute(
                "INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at)"
                " SELECT id, %s, %s, %s FROM unnest(%s::bigint[]) AS v(id)",
                [statuses[0], details[0], at or timezone.now(), int_array(ids)],
            )
        else:
            cursor.execute(
                "INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at)"
                " SELECT (e->>0)::bigint, e->>1, e->>2, %s FROM jsonb_array_elements(%s::jsonb) AS e",
                [at or timezone.now(), json_rows(zip(ids, statuses, details, strict=True))],
            )
    # Status events to the calling service and live inbox streams: one more statement for the whole batch.
    if reach:
        reach_record(zip(ids, statuses, details, strict=True), at=at)


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
    if moved:
        # A fallback chain reacts to the change: its next step may start, or be skipped (notifier/strategy.py
        # registers itself here; listeners sit above this module, so it cannot import them).
        for listener in list(_transition_listeners):
            listener(moved, to)
    return moved
