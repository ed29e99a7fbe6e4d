"""Replay and discard dead letters.

Replay puts a `failed` delivery back to `queued` with a fresh attempt budget and publishes it after commit.
Replaying twice is harmless: only a pending dead letter whose delivery is still `failed` moves, and the
worker's claim only takes queued/deferred deliveries, so a delivery is never sent twice because of a replay.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from core import progress
from notifier.clients.models import ApiClient
from notifier.deadletters.models import DeadLetter
from notifier.deliveries.models import Delivery
from notifier.deliveries.outbox import publish_delivery_ids
from notifier.deliveries.status import record_events, transition

logger = logging.getLogger(__name__)

# Dead letters handled per transaction by a bulk replay: bounded locks, and a crash half-way keeps what was done.
REPLAY_CHUNK = 1000


class DeadLetterError(Exception):
    """A dead letter cannot be replayed or discarded in its current state."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _publish_after_commit(delivery_ids: list[int]) -> None:
    def publish() -> None:
        # A failed publish leaves the deliveries queued with no published_at: the outbox relay takes them.
        publish_delivery_ids(delivery_ids)

    transaction.on_commit(publish)


def _replay_chunk(*, dead_letter_ids: Sequence[int], actor: str) -> list[int]:
    """Replay the pending dead letters among `dead_letter_ids`; return the delivery ids re-queued."""
    now = timezone.now()
    with transaction.atomic():
        letters = list(
            DeadLetter.objects.select_for_update()
            .filter(pk__in=list(dead_letter_ids), status=DeadLetter.Status.PENDING)
            .order_by("pk")
            .values_list("delivery_id", flat=True)
        )
        moved = transition(
            sorted(set(letters)),
            to=Delivery.Status.QUEUED,
            detail=f"replayed by {actor}",
            only_from=[Delivery.Status.FAILED],
            # A replay is the operator's recorded decision: it may go to any provider (the ambiguous pin is lifted).
            fields={
                "attempts": 0,
                "not_before": None,
                "published_at": None,
                "claimed_at": None,
                "reason": "",
                "pinned_provider": "",
            },
        )
        if moved:
            # Every pending record of a re-queued delivery is resolved by this replay, not only the ones asked.
            DeadLetter.objects.filter(delivery_id__in=moved, status=DeadLetter.Status.PENDING).update(
                status=DeadLetter.Status.REPLAYED, resolved_by=actor[:255], resolved_at=now
            )
            _publish_after_commit(moved)
    return moved


def dead_letter_replay(*, dead_letter: DeadLetter, actor: str) -> DeadLetter:
    """Replay one dead letter; raise DeadLetterError if it is resolved or its delivery is not `failed`."""
    if dead_letter.status != DeadLetter.Status.PENDING:
        raise DeadLetterError("not_pending", f"This dead letter is already {dead_letter.status}.")
    moved = _replay_chunk(dead_letter_ids=[dead_letter.pk], actor=actor)
    dead_letter.refresh_from_db()
    if not moved:
        if dead_letter.status != DeadLetter.Status.PENDING:
            raise DeadLetterError("not_pending", f"This dead letter is already {dead_letter.status}.")
        raise DeadLetterError("not_replayable", "Only a delivery in status 'failed' can be replayed.")
    logger.info("dead letters replayed: 1")
    return dead_letter


def pending_dead_letters(
    *, ids: Sequence[int] | None = None, channel: str | None = None, client: ApiClient | None = None
) -> QuerySet[DeadLetter]:
    """Return the pending dead letters matching the filters (all of them with no filter)."""
    qs = DeadLetter.objects.filter(status=DeadLetter.Status.PENDING)
    if ids is not None:
        qs = qs.filter(pk__in=list(ids))
    if channel:
        qs = qs.filter(channel=channel)
    if client is not None:
        qs = qs.filter(delivery__notification__client=client)
    return qs


def dead_letters_replay(
    *,
    ids: Sequence[int] | None = None,
    all: bool = False,
    channel: str | None = None,
    actor: str,
    client: ApiClient | None = None,
) -> int:
    """Replay the given dead letters (or all pending ones, optionally of one channel); return deliveries re-queued.

    With `client`, only dead letters of that API client's notifications are touched. Dead letters whose delivery
    is no longer `failed` stay pending (discard them). Works in chunks, each its own transaction.
    """
    if ids is None and not all:
        raise ValueError("give ids or all=True")
    qs = pending_dead_letters(ids=ids, channel=channel, client=client)
    replayed = 0
    last_pk = 0
    # Counted only for a watching command (`replay_dead_letters --all` can run for minutes).
    total = qs.count() if progress.watching() else None
    with progress.task("replay dead letters", total=total, unit="dead letters") as work:
        while True:
            chunk = list(qs.filter(pk__gt=last_pk).order_by("pk").values_list("pk", flat=True)[:REPLAY_CHUNK])
            if not chunk:
                break
            last_pk = chunk[-1]
            replayed += len(_replay_chunk(dead_letter_ids=chunk, actor=actor))
            work.advance(len(chunk))
    if replayed:
        logger.info("dead letters replayed: %d", replayed)
    return replayed


def dead_letter_discard(*, dead_letter: DeadLetter, actor: str) -> DeadLetter:
    """Mark a pending dead letter discarded (the delivery stays `failed`); its delivery's history notes it."""
    now = timezone.now()
    with transaction.atomic():
        updated = DeadLetter.objects.filter(pk=dead_letter.pk, status=DeadLetter.Status.PENDING).update(
            status=DeadLetter.Status.DISCARDED, resolved_by=actor[:255], resolved_at=now
        )
        dead_letter.refresh_from_db()
        if not updated:
            raise DeadLetterError("not_pending", f"This dead letter is already {dead_letter.status}.")
        status = Delivery.objects.filter(pk=dead_letter.delivery_id).values_list("status", flat=True).first()
        # The delivery does not change, but its history says an operator gave up on it, and who.
        detail = f"dead letter discarded by {actor}"
        record_events([(dead_letter.delivery_id, status or Delivery.Status.FAILED, detail)])
    return dead_letter


def dead_letters_discard(*, queryset: QuerySet[DeadLetter], actor: str) -> int:
    """Discard every pending dead letter of `queryset`; return how many were discarded."""
    count = 0
    for dead_letter in queryset.filter(status=DeadLetter.Status.PENDING).order_by("pk"):
        try:
            dead_letter_discard(dead_letter=dead_letter, actor=actor)
        except DeadLetterError:
            continue
        count += 1
    return count


# A pending dead letter keeps its delivery (and the delivery's day) for an operator's replay or discard.
KEEPS_DELIVERY = "EXISTS (SELECT 1 FROM notifier_deadletter x WHERE x.delivery_id = d.id AND x.status = 'pending')"


def dead_letters_forget_gone(cursor: Any, low: int, high: int) -> int:
    """Delete the dead letters of deliveries with ids in [low, high) that no longer exist; return how many."""
    cursor.execute(
        "DELETE FROM notifier_deadletter x WHERE x.delivery_id >= %s AND x.delivery_id < %s"
        " AND NOT EXISTS (SELECT 1 FROM notifier_delivery d WHERE d.id = x.delivery_id)",
        [low, high],
    )
    return int(cursor.rowcount)
