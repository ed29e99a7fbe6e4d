"""Fallback between channels: try the notification's channels in order, one step per channel.

With `strategy: "fallback"` the first step that can reach the recipient starts at accept (or when the fan-out
writes the recipient's deliveries); the later steps are written `pending`. The next step starts only if the
step before it gave up (failed, bounced, suppressed, cancelled) or did not reach `fallback_until` (sent,
delivered or opened) within `fallback_after_seconds` of its start. Once a step reaches it, every step still
pending ends `skipped`. Every decision is an event on the deliveries it moves.

Durability is that of any deferral: the next step's `pending` row carries the deadline in `not_before`, a
delayed broker message (`notifier.tasks.fallback_due`, native delayed delivery on the quorum queues) asks for
the decision at that time, and a periodic sweep decides whatever is overdue (the message was lost, or the
wait is longer than BROKER_DELAY_MAX_SECONDS). Nothing lives in worker memory, so restarting every worker
changes nothing.

Decisions are made against the deliveries' status at decision time: `fallback_decide` locks every delivery of
the (notification, recipient) chain (FOR UPDATE, in id order) and moves rows only with conditional updates
(`WHERE status = 'pending'`). A late `delivered` callback (which locks the same rows in `transition`) and the
timer are therefore serialised: whichever decides first wins, and the other finds nothing left to move.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from celery import current_app as celery_app
from django.conf import settings
from django.db import OperationalError, transaction
from django.utils import timezone

from core import task_names
from core.db import bound_cursor, int_array
from core.queues import ensure_topology
from notifier.deliveries.outbox import publish_now
from notifier.deliveries.status import deliveries_decide_chains, on_transition, record_events

if TYPE_CHECKING:  # types only: notifier.models is not imported at run time here
    from notifier.deliveries.models import Delivery, Notification

# A step's new plan for one delivery: (status, reason, not_before).
StepChange = tuple[str, str, datetime | None]

logger = logging.getLogger(__name__)

ALL = "all"
FALLBACK = "fallback"
STRATEGIES = (ALL, FALLBACK)
UNTIL = ("sent", "delivered", "opened")
DEFAULT_UNTIL = "sent"
DEFAULT_AFTER_SECONDS = 300
MAX_AFTER_SECONDS = 7 * 86400
REASON = "fallback"

# A step has reached `fallback_until` when one of its deliveries is in one of these statuses.
REACHED = {
    "sent": frozenset({"sent", "delivered", "opened"}),
    "delivered": frozenset({"delivered", "opened"}),
    "opened": frozenset({"opened"}),
}
# A step whose deliveries all ended in these gave up: the next starts at once.
GAVE_UP = frozenset({"failed", "bounced", "suppressed", "cancelled", "skipped"})
# Statuses of a delivery that has not gone to a provider yet (may still be stopped).
WAITING = frozenset({"queued", "scheduled", "deferred"})


def notification_fields(data: dict[str, Any]) -> dict[str, Any]:
    """Return the Notification fields for a validated request's strategy (defaults filled in for fallback)."""
    if data.get("strategy") != FALLBACK:
        return {}
    return {
        "strategy": FALLBACK,
        "fallback_until": data.get("fallback_until") or DEFAULT_UNTIL,
        "fallback_after_seconds": data.get("fallback_after_seconds") or DEFAULT_AFTER_SECONDS,
    }


def is_fallback(notification: Notification) -> bool:
    """Return whether a notification's channels are tried in order."""
    return getattr(notification, "strategy", ALL) == FALLBACK


def window(notification: Notification) -> timedelta:
    """Return how long a step has to reach fallback_until before the next one starts."""
    return timedelta(seconds=notification.fallback_after_seconds or DEFAULT_AFTER_SECONDS)


def plan_steps(
    channels: Sequence[str], items: Sequence[tuple[str, str, datetime | None]], *, start: datetime, wait: timedelta
) -> list[StepChange | None]:
    """Decide which of one recipient's new deliveries start now and which wait; return a change per item.

    `items` are (channel, planned status, planned not_before) of the recipient's deliveries. The first step
    with a delivery that would go out keeps its plan; later steps' would-be deliveries become `pending`: the
    next one with a deadline `wait` after the first step is due (its send_at, local time or quiet hours, if
    later than `start`), the ones after it without a time (they wait for the next decision). Returns, per
    item, None (unchanged) or (status, reason, not_before).
    """
    live_steps = sorted({channels.index(ch) for ch, status, _ in items if status in WAITING})
    if len(live_steps) < 2:
        return [None] * len(items)
    first, nxt = live_steps[0], live_steps[1]
    due = [nb for ch, status, nb in items if channels.index(ch) == first and status in WAITING and nb is not None]
    deadline = max([start, *due]) + wait
    out: list[StepChange | None] = []
    for ch, status, _ in items:
        step = channels.index(ch)
        if step > first and status in WAITING:
            out.append(("pending", REASON, deadline if step == nxt else None))
        else:
            out.append(None)
    return out


def start_of(notification: Notification, now: datetime) -> datetime:
    """Return when the first step starts (its send time, if later than now)."""
    send_at = getattr(notification, "send_at", None)
    return max(now, send_at) if send_at else now


def plan_at_accept(notification: Notification, deliveries: Sequence[Delivery], now: datetime) -> None:
    """Hold the later steps of a single recipient's fallback chain as `pending` (before the rows are written)."""
    if not is_fallback(notification):
        return
    items = [(d.channel, d.status, d.not_before) for d in deliveries]
    changes = plan_steps(notification.channels, items, start=start_of(notification, now), wait=window(notification))
    for d, change in zip(deliveries, changes, strict=True):
        if change is not None:
            d.status, d.reason, d.not_before = change


def after_accept(accepted: Sequence[tuple[Notification, Sequence[Delivery]]], now: datetime) -> None:
    """Record why the new chains start where they do (one statement), and ask for their first decisions after commit.

    `accepted` holds each new notification with its written deliveries; those of other strategies are skipped.
    """
    events: list[tuple[int, str, str]] = []
    timers: dict[int, list[int]] = defaultdict(list)
    for notification, deliveries in accepted:
        if not is_fallback(notification):
            continue
        events.extend(
            _chain_start_events(
                notification, [(d.pk, d.channel, d.status, d.reason, d.recipient_id) for d in deliveries]
            )
        )
        timed = [(d.pk, d.not_before) for d in deliveries if d.status == "pending" and d.not_before is not None]
        if timed:
            # Whole seconds, as the timer's countdown is: one message per distinct second.
            timers[math.ceil((min(at for _, at in timed) - now).total_seconds())].extend(pk for pk, _ in timed)
    if events:
        record_events(events, at=now)
    for delay, ids in timers.items():
        transaction.on_commit(partial(schedule, ids, float(delay)))


def record_start_events(notification: Notification, rows: Sequence[tuple[Any, ...]], now: datetime) -> None:
    """Record, per recipient, why a chain starts past its first channel: one statement for all of them.

    `rows` are the new deliveries as (id, channel, status, reason, recipient_id): the rows a fan-out page inserted,
    so that a subscriber's chain gets the same events as the same recipient's single (`after_accept`).
    """
    events = _chain_start_events(notification, rows)
    if events:
        record_events(events, at=now)


def _chain_start_events(notification: Notification, rows: Sequence[tuple[Any, ...]]) -> list[tuple[int, str, str]]:
    """Return the events that explain where each recipient's chain starts, for `rows` as record_start_events."""
    if not is_fallback(notification):
        return []
    by_recipient: dict[Any, list[tuple[int, str, str, str]]] = defaultdict(list)
    for delivery_id, channel, status, reason, recipient_id in rows:
        by_recipient[recipient_id].append((delivery_id, channel, status, reason))
    return [event for mine in by_recipient.values() for event in _start_events(notification.channels, mine)]


def _start_events(channels: Sequence[str], rows: Sequence[tuple[int, str, str, str]]) -> list[tuple[int, str, str]]:
    """Explain a chain that starts past its first channel: `fallback: push suppressed (no_address)`."""
    live = [r for r in rows if r[2] in WAITING]
    if not live:
        return []
    first = min(channels.index(r[1]) for r in live)
    skipped = [r for r in rows if channels.index(r[1]) < first]
    if not skipped:
        return []
    why = ", ".join(sorted({f"{r[1]} {r[2]} ({r[3]})" if r[3] else f"{r[1]} {r[2]}" for r in skipped}))
    return [(r[0], r[2], f"fallback: {why}") for r in live if channels.index(r[1]) == first]


def plan_fanout_rows(notification: Notification, rows: list[tuple[Any, ...]], now: datetime) -> list[tuple[Any, ...]]:
    """Apply plan_steps per recipient to a fan-out page's rows (recipient_id, channel, address, status, reason, nb)."""
    if not is_fallback(notification):
        return rows
    start, wait = start_of(notification, now), window(notification)
    by_recipient: dict[Any, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        by_recipient[row[0]].append(i)
    out = list(rows)
    for indexes in by_recipient.values():
        items = [(rows[i][1], rows[i][3], rows[i][5]) for i in indexes]
        changes = plan_steps(notification.channels, items, start=start, wait=wait)
        for i, change in zip(indexes, changes, strict=True):
            if change is not None:
                out[i] = (rows[i][0], rows[i][1], rows[i][2], *change)
    return out


def after_fanout_page(notification: Notification, inserted: Sequence[tuple[Any, ...]], now: datetime) -> None:
    """Ask for the decision on a fan-out page's pending steps at their deadline."""
    if not is_fallback(notification):
        return
    pending = [row[0] for row in inserted if row[2] == "pending"]
    if not pending:
        return
    # Deadlines differ per subscriber (local time, quiet hours): one timer message per distinct second.
    with bound_cursor() as cursor:
        cursor.execute(
            "SELECT id, not_before FROM notifier_delivery WHERE id = ANY(%s::bigint[])"
            " AND status = 'pending' AND not_before IS NOT NULL",
            [int_array(pending)],
        )
        timers: dict[int, list[int]] = defaultdict(list)
        for delivery_id, not_before in cursor.fetchall():
            timers[math.ceil((not_before - now).total_seconds())].append(delivery_id)
    for delay, ids in timers.items():
        schedule(ids, float(delay))


def schedule(delivery_ids: Sequence[int], delay: float) -> None:
    """Publish a delayed `fallback_due` message for these pending deliveries; the sweep covers a failure."""
    if not delivery_ids or delay > settings.BROKER_DELAY_MAX_SECONDS:
        return  # long waits stay in the database: the sweep decides them when due
    try:
        options: dict[str, Any] = {"queue": "maintenance", "retry": False}
        if delay > 0:
            ensure_topology()
            # Whole seconds, rounded up: early would find the step not yet due.
            options["countdown"] = math.ceil(delay)
        celery_app.send_task(task_names.FALLBACK_DUE, args=[list(delivery_ids)], **options)
    except Exception as exc:  # the pending rows are the record; the sweep decides them when due
        logger.warning("fallback timer not published (%d deliveries left to the sweep): %s", len(delivery_ids), exc)


@dataclass
class Decisions:
    """What one decision round did: ids moved per kind, and what to publish after commit."""

    started: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    publish: list[tuple[int, str, str]] = field(default_factory=list)
    timers: dict[float, list[int]] = field(default_factory=lambda: defaultdict(list))


_CHAIN_SQL = """
    SELECT d.id, d.notification_id, d.recipient_id, d.channel, d.status, d.reason, d.not_before, d.priority,
           n.channels, n.fallback_until, n.fallback_after_seconds
    FROM notifier_delivery d JOIN notifier_notification n ON n.id = d.notification_id
    WHERE (d.notification_id, d.recipient_id) IN (
        SELECT notification_id, recipient_id FROM notifier_delivery WHERE id = ANY(%s::bigint[])
    ) AND n.strategy = 'fallback'
    ORDER BY d.id
    FOR UPDATE OF d
"""


def fallback_decide(*, delivery_ids: Iterable[int]) -> Decisions:
    """Decide the fallback chains the given deliveries belong to, against their status now; return the moves.

    Safe to call for any deliveries, any number of times: deliveries of other strategies are ignored, and a
    chain with nothing to decide (its step still has time, or it is finished) is left as it is.
    """
    ids = sorted(set(delivery_ids))
    if not ids:
        return Decisions()
    for attempt in range(3):
        try:
            decisions = _decide_locked(ids)
            break
        except OperationalError as exc:  # a deadlock with a concurrent outcome write: decide again
            if attempt == 2:
                raise
            logger.info("fallback decision retried after %s", type(exc).__name__)

    def publish_after_commit() -> None:
        if decisions.publish:
            publish_now(decisions.publish)
        for delay, timed in decisions.timers.items():
            schedule(timed, delay)

    # Inside a caller's transaction (a callback's), a worker must not see the message before the rows.
    transaction.on_commit(publish_after_commit)
    return decisions


def _decide_locked(ids: list[int]) -> Decisions:
    decisions = Decisions()
    now = timezone.now()
    with transaction.atomic(), bound_cursor() as cursor:
        cursor.execute(_CHAIN_SQL, [int_array(ids)])
        chains: dict[tuple[Any, int], list[tuple[Any, ...]]] = defaultdict(list)
        for row in cursor.fetchall():
            chains[(row[1], row[2])].append(row)
        if not chains:
            return decisions
        events: list[tuple[int, str, str]] = []
        starts: list[int] = []
        skips: list[int] = []
        deadlines: list[tuple[int, datetime]] = []
        for rows in chains.values():
            _decide_chain(rows, now, decisions, events, starts, skips, deadlines)
        deliveries_decide_chains(skips=skips, starts=starts, deadlines=deadlines, events=events, at=now)
    return decisions


def _decide_chain(
    rows: list[tuple[Any, ...]],
    now: datetime,
    decisions: Decisions,
    events: list[tuple[int, str, str]],
    starts: list[int],
    skips: list[int],
    deadlines: list[tuple[int, datetime]],
) -> None:
    """Decide one (notification, recipient) chain; append its moves and their events."""
    channels: list[str] = rows[0][8]
    until: str = rows[0][9] or DEFAULT_UNTIL
    seconds = rows[0][10] or DEFAULT_AFTER_SECONDS

    def step(row: tuple[Any, ...]) -> int:
        return channels.index(row[3])

    pending = [r for r in rows if r[4] == "pending"]
    if not pending:
        return
    nxt = min(step(r) for r in pending)
    earlier = [r for r in rows if step(r) < nxt]
    reached = [r for r in earlier if r[4] in REACHED[until]]
    if reached:
        why = f"fallback: {reached[0][3]} reached {reached[0][4]}"
        for r in pending:
            skips.append(r[0])
            events.append((r[0], "skipped", why))
            decisions.skipped.append(r[0])
        return
    current = [r for r in rows if step(r) == nxt and r[4] == "pending"]
    if earlier and all(r[4] in GAVE_UP for r in earlier):
        last = max(earlier, key=step)
        why = f"fallback: {last[3]} {last[4]}" + (f" ({last[5]})" if last[5] else "")
    elif any(r[6] is not None and r[6] <= now + timedelta(seconds=1) for r in current):
        active = max(step(r) for r in earlier) if earlier else nxt
        why = f"fallback: {channels[active]} not {until} within {seconds}s"
        # What of the timed-out step has not reached a provider yet is no longer needed.
        for r in earlier:
            if r[4] in WAITING:
                skips.append(r[0])
                events.append((r[0], "skipped", f"fallback: moved on to {channels[nxt]}"))
                decisions.skipped.append(r[0])
    else:
        return  # the step before still has time
    for r in current:
        starts.append(r[0])
        events.append((r[0], "queued", why))
        decisions.started.append(r[0])
        decisions.publish.append((r[0], r[3], r[7]))
    later = [r for r in pending if step(r) > nxt]
    if later:
        following = min(step(r) for r in later)
        deadline = now + timedelta(seconds=seconds)
        for r in later:
            if step(r) == following:
                deadlines.append((r[0], deadline))
                decisions.timers[float(seconds)].append(r[0])


def after_outcomes(updates: Sequence[tuple[Any, dict[str, Any]]]) -> None:
    """React to a batch's outcomes (called after they are committed): decide the chains of fallback deliveries."""
    ids = [d.pk for d, fields in updates if "status" in fields and is_fallback(d.notification)]
    if ids:
        fallback_decide(delivery_ids=ids)


@on_transition
def after_transition(delivery_ids: Sequence[int], status: str) -> None:
    """React to a status change made outside the send pipeline (a callback, an inbox read, a cancel)."""
    if delivery_ids and (status in GAVE_UP or status in REACHED["sent"]):
        fallback_decide(delivery_ids=delivery_ids)


def fallback_sweep(*, limit: int = 1000, grace_seconds: float = 10.0) -> int:
    """Decide the chains whose next step is overdue (the timer message was lost or never sent); return how many."""
    with bound_cursor() as cursor:
        cursor.execute(
            "SELECT id FROM notifier_delivery WHERE status = 'pending'"
            " AND not_before <= now() - make_interval(secs => %s) ORDER BY not_before LIMIT %s",
            [grace_seconds, limit],
        )
        ids = [row[0] for row in cursor.fetchall()]
    if ids:
        fallback_decide(delivery_ids=ids)
    return len(ids)
