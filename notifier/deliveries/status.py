"""The one writer of a delivery's status: every change of it is appended to the event history in the same batch.

`transition` moves deliveries from one status to another (guarded by the current one), `outcomes_write` and
`outcomes_write_with_events` apply the send pipeline's outcomes, and the other writers below change what one
path needs (claims, publishing, deferral); none but this module updates `notifier_delivery.status`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.db import bound_cursor, insert_rows, insert_statement, int_array, json_rows, span_prepare
from notifier.deliveries.models import Delivery, Notification

TransitionListener = Callable[[list[int], str], None]
_transition_listeners: list[TransitionListener] = []
# Called with every batch of (delivery_id, status, detail) events recorded (status events to the calling
# service, the inbox streams' NOTIFY: notifier.statusevents registers it; it sits above this module).
EventsListener = Callable[[list[tuple[int, str, str]], datetime | None], object]
_events_listeners: list[EventsListener] = []

# An event that changes no status: a click on one of a delivery's links (notifier.tracking's redirect and the
# inbox, SES through notifier.callbacks), its detail "<source> <url>". The URL is the message's own, so it may
# carry the recipient's data: an erasure keeps only the source (notifier/deliveries/erasure.py, archive.py).
CLICKED = "clicked"


def on_transition(listener: TransitionListener) -> TransitionListener:
    """Register `listener(moved_ids, to_status)`, called after every `transition` that moved rows."""
    if listener not in _transition_listeners:
        _transition_listeners.append(listener)
    return listener


def on_events_recorded(listener: EventsListener) -> EventsListener:
    """Register `listener(events, at)`, called with every batch `record_events` writes (unless reach=False)."""
    if listener not in _events_listeners:
        _events_listeners.append(listener)
    return listener


def record_events(
    rows: Iterable[tuple[int, str, str]],
    *,
    at: datetime | None = None,
    reach: bool = True,
    existing: bool = False,
    forget_erased: bool = False,
) -> None:
    """Append (delivery_id, status, detail) events with one INSERT … SELECT, however many.

    `reach=False` skips the listeners (status events, inbox notifications: notifier/statusevents/record.py), for a
    caller that knows none of these deliveries is in-app and none of their clients has an event endpoint (the send
    pipeline decides it once per batch). `existing=True` appends only the events of deliveries the log still holds,
    for a caller that has an id from outside it (a link in an old email): retention drops whole days, and an event
    for a dropped day would find no partition to go in. `forget_erased` (with `existing`) keeps only the first word
    of the detail of a delivery whose recipient was erased, as the erasure left the events before it
    (notifier/deliveries/erasure.py): a link clicked in an email read after the erasure records its source, not
    the URL rendered from the recipient's payload.
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
    if same:
        select = "SELECT v.id, %s, %s, %s FROM unnest(%s::bigint[]) AS v(id)"
        params = [statuses[0], details[0], at or timezone.now(), int_array(ids)]
    else:
        select = (
            "SELECT v.id, v.e->>1, v.e->>2, %s FROM"
            " (SELECT (e->>0)::bigint AS id, e FROM jsonb_array_elements(%s::jsonb) AS e) AS v"
        )
        params = [at or timezone.now(), json_rows(zip(ids, statuses, details, strict=True))]
    if existing:
        # Joined to the delivery: no row for a delivery the log no longer holds.
        detail, erased = "x.detail", ""
        if forget_erased:
            detail = "CASE WHEN r.erased_at IS NULL THEN x.detail ELSE split_part(x.detail, ' ', 1) END"
            erased = " LEFT JOIN preferences_recipient r ON r.id = d.recipient_id"
        select = (
            f"SELECT x.id, x.status, {detail}, x.at FROM ({select}) AS x(id, status, detail, at)"  # noqa: S608 - fixed text
            f" JOIN notifier_delivery d ON d.id = x.id{erased} RETURNING delivery_id, detail"
        )
    with bound_cursor() as cursor:
        cursor.execute(f"INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at) {select}", params)
        written = dict(cursor.fetchall()) if existing else None
    if reach and _events_listeners:
        events = list(zip(ids, statuses, details, strict=True))
        if written is not None:  # as stored: what was not written reaches no one, an erased click without its URL
            events = [(i, status, written[i]) for i, status, _ in events if i in written]
        _reach(events, at)


def _reach(events: list[tuple[int, str, str]], at: datetime | None) -> None:
    # Status events to the calling service and live inbox streams: one more statement for the whole batch.
    for listener in list(_events_listeners):
        listener(events, at)


# The deliveries' first events, from what their INSERT returned (the same truncation as record_events).
_FIRST_EVENTS = (
    "v AS (INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at)"
    " SELECT id, status, left(reason, 1024), %s FROM d)"
)


def deliveries_insert(
    deliveries: Sequence[Delivery], *, at: datetime, notifications: Sequence[Notification] = ()
) -> None:
    """INSERT new deliveries with their first events (and `notifications` with them) in one statement.

    What insert_rows of each table and record_events do, in one round trip instead of three: the statements
    are data-modifying parts of one WITH, the events read the delivery ids the deliveries' INSERT returned.
    Each delivery gets its generated id (in insert order, as insert_rows); the listeners of record_events are
    called as for any batch of events.
    """
    if not deliveries:
        insert_rows(notifications)
        return
    parts: list[str] = []
    params: list[Any] = []
    written_notifications = insert_statement(notifications) if notifications else None
    if written_notifications is not None:
        parts.append(f"n AS ({written_notifications.sql})")
        params.append(written_notifications.rows)
    written = insert_statement(deliveries)
    parts.append(f"d AS ({written.sql} RETURNING id, status, reason)")
    params.append(written.rows)
    parts.append(_FIRST_EVENTS)
    params.append(at)
    with bound_cursor() as cursor:
        # The parts are the models' own INSERT statements (core.db.insert_statement) and constants; values are bound.
        cursor.execute("WITH " + ", ".join(parts) + " SELECT id FROM d", params)  # noqa: S608
        ids = [row[0] for row in cursor.fetchall()]
    if written_notifications is not None:
        written_notifications.saved()
    written.saved(ids)
    if _events_listeners:
        _reach([(d.pk, d.status, d.reason[:1024]) for d in deliveries], at)


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
        # A fallback chain reacts to the change: its next step may start, or be skipped (notifier/deliveries/fallback.py
        # registers itself here; listeners sit above this module, so it cannot import them).
        for listener in list(_transition_listeners):
            listener(moved, to)
    return moved


# The columns a send outcome may change (channels_app.outcomes); every touched row is written with all of them in one
# statement.
OUTCOME_COLUMNS = (
    ("status", "text"),
    ("reason", "text"),
    ("provider", "text"),
    ("pinned_provider", "text"),
    ("provider_message_id", "text"),
    ("attempts", "integer"),
    ("last_error", "text"),
    ("not_before", "timestamptz"),
    ("published_at", "timestamptz"),
    ("sent_at", "timestamptz"),
    ("template_version_id", "bigint"),
    ("content", "jsonb"),
    ("sms_encoding", "text"),
    ("sms_segments", "integer"),
)


def _outcomes_update(updates: list[tuple[Delivery, dict[str, Any]]], at: datetime) -> tuple[str, list[Any]]:
    """Return the UPDATE … FROM jsonb_array_elements(…) that applies every outcome to its row ("" for none).

    Outcomes differ per row (a provider message id each), so grouping rows by identical values would be
    one statement per delivery; one JSON parameter of per-row values keeps it one round trip.
    """
    rows: dict[int, Delivery] = {}
    for delivery, fields in updates:
        for name, value in fields.items():
            setattr(delivery, name, value)
        rows[delivery.pk] = delivery
    if not rows:
        return "", []
    deliveries = list(rows.values())
    # A column with one value across the group (status, provider, sent_at, …) travels as one parameter;
    # only the columns that differ per row (the provider's message id) travel in the rows.
    assignments: list[str] = []
    params: list[Any] = []
    varying: list[list[Any]] = []
    for name, kind in OUTCOME_COLUMNS:
        values = [getattr(d, name) for d in deliveries]
        if kind == "jsonb":
            values = [json.dumps(v) if v is not None else None for v in values]
        cast = "text" if kind == "jsonb" else kind
        suffix = "::jsonb" if kind == "jsonb" else ""
        if all(v == values[0] for v in values):
            assignments.append(f"{name} = %s::{cast}{suffix}")
            params.append(values[0])
        else:
            assignments.append(f"{name} = (e->>{len(varying) + 1})::{cast}{suffix}")
            varying.append(values)
    sql = (
        f"UPDATE notifier_delivery AS d SET {', '.join(assignments)}, updated_at = %s"  # noqa: S608 - fixed names
        " FROM jsonb_array_elements(%s::jsonb) AS e WHERE d.id = (e->>0)::bigint"
        # The ids' own span as constants: the planner prunes to their day's partition
        # (notifier/deliveries/partitions.py).
        " AND d.id BETWEEN %s AND %s"
    )
    ids = [d.pk for d in deliveries]
    return sql, [*params, at, json_rows(zip(ids, *varying, strict=True)), min(ids), max(ids)]


def outcomes_write(updates: list[tuple[Delivery, dict[str, Any]]], at: datetime) -> None:
    """Apply the send pipeline's outcomes (new field values per delivery) in a single statement, whatever the count."""
    sql, params = _outcomes_update(updates, at)
    if sql:
        with bound_cursor() as cursor:
            cursor.execute(sql, params, prepare=span_prepare([d.pk for d, _ in updates]))


def outcomes_write_with_events(
    updates: list[tuple[Delivery, dict[str, Any]]], events: list[tuple[int, str, str]], at: datetime
) -> None:
    """Write the rows and their events as one statement: one round trip and one commit, no transaction block.

    Only for a group with no status events to write (they read the rows' new values, which a statement's
    other parts do not see), no dead letter and no suppression (the common case of a campaign's batch).
    """
    update, params = _outcomes_update(updates, at)
    parts = [f"u AS ({update} RETURNING d.id)"] if update else []
    if events:
        parts.append(
            "ev AS (INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at)"
            " SELECT (e->>0)::bigint, e->>1, e->>2, %s FROM jsonb_array_elements(%s::jsonb) AS e)"
        )
        params += [at, json_rows((i, status, detail[:1024]) for i, status, detail in events)]
    if not parts:
        return
    with bound_cursor() as cursor:
        prepare = span_prepare([d.pk for d, _ in updates])
        cursor.execute(f"WITH {', '.join(parts)} SELECT 1", params, prepare=prepare)


@dataclass(frozen=True)
class Claim:
    """What a claim took: the ids now owned, the attempts of those taken back after a lease, the DB's time."""

    ids: list[int]
    reclaimed: dict[int, int]
    db_now: datetime | None


# What a claim may take among the ids given: waiting and due, or in `sending` past its lease. The ids' span as
# constants too: the planner prunes to their day's partition (notifier/deliveries/partitions.py).
_CLAIMABLE = """
    id = ANY(%(ids)s::bigint[]) AND id BETWEEN %(low)s AND %(high)s AND (
        (status IN ('queued', 'deferred') AND (not_before IS NULL OR not_before <= now() + interval '1 second')
         AND reason NOT LIKE 'digest%%')
        OR (status = 'sending' AND claimed_at < now() - make_interval(secs => %(lease)s))
    )
"""
# `target` locks the rows in id order; the update then finds the same rows by the same test (each already
# locked by this statement, so it waits for nothing). Not by joining `target`: with statistics from before the
# rows, that join looped over the locked rows for every row updated (999,000 comparisons for 1,000 ids).
# PostgreSQL runs a plain sub-statement of WITH only as far as something reads it, so the update's one-time
# test counts all of `target` first: every row is locked, in order, before the first is updated. The rows
# taken back after a lease come from `target` as one array, evaluated once and usually empty.
_CLAIM_SQL = f"""
    WITH target AS (
        SELECT id, status AS was FROM notifier_delivery WHERE {_CLAIMABLE} ORDER BY id FOR UPDATE
    ), claimed AS (
        UPDATE notifier_delivery
        SET status = 'sending', attempts = attempts + 1, claimed_at = now(), updated_at = now()
        WHERE {_CLAIMABLE} AND (SELECT count(*) FROM target) > 0
        RETURNING id, attempts, id = ANY(ARRAY(SELECT id FROM target WHERE was = 'sending')) AS again
    ), events AS (
        INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at)
        SELECT id, 'sending', CASE WHEN again THEN 'reclaimed after lease expiry' ELSE '' END, now()
        FROM claimed
    )
    SELECT id, attempts, again, now() FROM claimed
"""  # noqa: S608  # _CLAIMABLE is a constant


def deliveries_claim(delivery_ids: Sequence[int], *, lease_seconds: float) -> Claim:
    """Atomically move waiting deliveries to `sending`; return the ids this worker now owns.

    Only a delivery still waiting (queued or deferred, and due) can be claimed, or one whose worker died
    mid-send (`sending` past `lease_seconds`). A second message for the same delivery therefore finds nothing.
    Every claim counts an attempt, a re-claim after a lease expiry too (the pipeline fails and dead-letters
    a delivery re-claimed past DELIVERY_MAX_ATTEMPTS: a delivery that kills its worker cannot loop). A row
    locked by someone else (another claim, the publisher recording `published_at`) is waited for, then
    checked again, never skipped: skipping it would ack the message and strand the row. Rows are locked in id
    order, so two claims of overlapping batches cannot deadlock. The database's `now()`
    comes back with the rows: every time the pipeline writes is on the database's clock.

    `id = ANY(…)`, not a semi-join over `unnest(…)`, whose plan can turn quadratic (core.db.int_array).
    """
    with bound_cursor() as cursor:
        # One statement, so no transaction block: the claim and its events commit together.
        low, high = (min(delivery_ids), max(delivery_ids)) if delivery_ids else (0, -1)
        cursor.execute(
            _CLAIM_SQL,
            {"ids": int_array(delivery_ids), "low": low, "high": high, "lease": lease_seconds},
            prepare=span_prepare(delivery_ids),
        )
        rows = cursor.fetchall()
    return Claim(
        ids=[row[0] for row in rows],
        reclaimed={row[0]: row[1] for row in rows if row[2]},
        db_now=rows[0][3] if rows else None,
    )


def deliveries_renew_leases(delivery_ids: Sequence[int]) -> int:
    """Renew the lease (`claimed_at`) of those deliveries still `sending`; return how many were renewed.

    Rows locked right now are skipped, never waited for: they are being written by the same process's outcome
    writer (finished anyway), and waiting on it while it waits on us was a deadlock.
    """
    with bound_cursor() as cursor:
        cursor.execute(
            "UPDATE notifier_delivery SET claimed_at = now() WHERE id IN ("
            " SELECT id FROM notifier_delivery WHERE id = ANY(%s::bigint[]) AND status = 'sending'"
            " FOR UPDATE SKIP LOCKED)",
            [int_array(list(delivery_ids))],
        )
        return cursor.rowcount


def deliveries_wake_due(*, limit: int, overdue_after: float) -> list[tuple[int, str, str]]:
    """Move up to `limit` scheduled or deferred deliveries now due to `queued`; return their (id, channel, priority).

    A deferred delivery with a publish on record has a delayed message on its way; it is woken here only when
    that message is clearly overdue (`overdue_after` seconds: lost), so the broker's delayed delivery stays the
    normal path.
    """
    sql = """
        UPDATE notifier_delivery SET status = 'queued', updated_at = now()
        WHERE id IN (
            SELECT id FROM notifier_delivery
            WHERE status IN ('scheduled', 'deferred') AND not_before <= now()
              AND (published_at IS NULL OR not_before < now() - make_interval(secs => %s))
            ORDER BY not_before LIMIT %s FOR UPDATE SKIP LOCKED
        )
        RETURNING id, channel, priority
    """
    with transaction.atomic(), bound_cursor() as cursor:
        cursor.execute(sql, [overdue_after, limit])
        rows = [(int(r[0]), str(r[1]), str(r[2])) for r in cursor.fetchall()]
        record_events((row[0], Delivery.Status.QUEUED, "due") for row in rows)
    return rows


_HOLD_OF_CAMPAIGN_SQL = """
    UPDATE notifier_delivery SET status = 'deferred', reason = %s, not_before = %s, published_at = NULL,
                                 updated_at = %s
    WHERE notification_id IN (SELECT id FROM notifier_notification WHERE campaign_id = %s)
      AND status IN ('queued', 'deferred', 'scheduled') AND reason NOT LIKE 'digest%%'
    RETURNING id
"""

_RELEASE_OF_CAMPAIGN_SQL = """
    UPDATE notifier_delivery SET status = 'queued', reason = '', not_before = NULL, published_at = NULL,
                                 updated_at = %s
    WHERE notification_id IN (SELECT id FROM notifier_notification WHERE campaign_id = %s)
      AND status = 'deferred' AND reason = %s
    RETURNING id, channel, priority
"""


def deliveries_hold_of_campaign(
    *, campaign_id: int, reason: str, until: datetime, at: datetime, detail: str
) -> list[int]:
    """Defer a campaign's not-yet-sent deliveries (digests aside) until `until` with `reason`; return their ids."""
    with transaction.atomic(), bound_cursor() as cursor:
        cursor.execute(_HOLD_OF_CAMPAIGN_SQL, [reason, until, at, campaign_id])
        held = [int(row[0]) for row in cursor.fetchall()]
        record_events(((i, Delivery.Status.DEFERRED, detail) for i in held), at=at)
    return held


def deliveries_release_of_campaign(
    *,
    campaign_id: int,
    reason: str,
    at: datetime,
    detail: str,
    local_times: Callable[[list[int]], Mapping[int, datetime]] | None = None,
) -> tuple[list[tuple[int, str, str]], set[int]]:
    """Queue again a campaign's deliveries held with `reason`; return the (id, channel, priority) queued and the rest.

    `local_times(ids)` gives the released deliveries whose moment has not come yet (a local-time campaign): those
    are scheduled for it instead, and returned as the set.
    """
    with transaction.atomic(), bound_cursor() as cursor:
        cursor.execute(_RELEASE_OF_CAMPAIGN_SQL, [at, campaign_id, reason])
        released = [(int(r[0]), str(r[1]), str(r[2])) for r in cursor.fetchall()]
        times = local_times([row[0] for row in released]) if local_times is not None and released else {}
        by_time: dict[datetime, list[int]] = {}
        for delivery_id, when in times.items():
            by_time.setdefault(when, []).append(delivery_id)
        for when, ids in by_time.items():
            Delivery.objects.filter(pk__in=ids).update(status=Delivery.Status.SCHEDULED, not_before=when, updated_at=at)
        queued = [row for row in released if row[0] not in times]
        record_events(((row[0], Delivery.Status.QUEUED, detail) for row in queued), at=at)
        record_events(((i, Delivery.Status.SCHEDULED, detail) for i in sorted(times)), at=at)
    return queued, set(times)


def deliveries_decide_chains(
    *,
    skips: Sequence[int],
    starts: Sequence[int],
    deadlines: Sequence[tuple[int, datetime]],
    events: Iterable[tuple[int, str, str]],
    at: datetime,
) -> None:
    """Apply a round of fallback decisions (notifier.deliveries.fallback) with its events, in the caller's transaction.

    Skipped steps end `skipped`, started ones are queued (published by the caller after commit), and pending ones
    get their new deadline.
    """
    with bound_cursor() as cursor:
        if skips:
            cursor.execute(
                "UPDATE notifier_delivery SET status = 'skipped', updated_at = %s"
                " WHERE id = ANY(%s::bigint[])"
                " AND status IN ('pending', 'queued', 'scheduled', 'deferred')",
                [at, int_array(list(skips))],
            )
        if starts:
            cursor.execute(
                "UPDATE notifier_delivery SET status = 'queued', reason = '', not_before = NULL, published_at = NULL,"
                " updated_at = %s WHERE id = ANY(%s::bigint[]) AND status = 'pending'",
                [at, int_array(list(starts))],
            )
        if deadlines:
            cursor.execute(
                "UPDATE notifier_delivery AS d SET not_before = (e->>1)::timestamptz, updated_at = %s"
                " FROM jsonb_array_elements(%s::jsonb) AS e WHERE d.id = (e->>0)::bigint AND d.status = 'pending'",
                [at, json_rows(deadlines)],
            )
    record_events(events, at=at)


def deliveries_digest(digests: Mapping[int, Sequence[int]], *, at: datetime) -> None:
    """Mark the waiting deliveries of each new digest delivery `digested`, with the events of both."""
    events: list[tuple[int, str, str]] = []
    for digest_id, items in digests.items():
        events.append((digest_id, Delivery.Status.QUEUED, f"digest of {len(items)}"))
        events += [(i, Delivery.Status.DIGESTED, f"digest delivery {digest_id}") for i in items]
    with transaction.atomic():
        Delivery.objects.filter(pk__in=[i for items in digests.values() for i in items]).update(
            status=Delivery.Status.DIGESTED, updated_at=at
        )
        record_events(events, at=at)
