"""Accepting notifications and cancelling them.

Accepting is the hot path, in three steps whatever the request: decide (notifier/accepting/decide.py: the send's
rules, then each recipient's deliveries), deduplicate (here: a dedup_key seen before is that notification, with
another body a 409), write (notifier/accepting/write.py: one statement per table for one request or a thousand,
published after commit). A single, a group of concurrent singles (group commit) and a batch all take this one
path; no provider is ever called here.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from core import metrics
from core.errors import ApiError
from core.group_commit import GroupCommit
from notifier.accepting.decide import notification_decide
from notifier.accepting.write import AcceptItem, AcceptResult, DedupRace, notifications_write, topic_unknown
from notifier.clients.models import ApiClient
from notifier.deliveries import dedup
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.partitions import new_notification_id, notification_range
from notifier.deliveries.status import transition
from notifier.dispatch.fanout import fanout_start
from preferences.models import Topic
from projects.scoping import as_client_owner

logger = logging.getLogger(__name__)

CANCELLABLE = (Delivery.Status.SCHEDULED, Delivery.Status.DEFERRED, Delivery.Status.QUEUED, Delivery.Status.PENDING)

# How many times a call looks its dedup keys up again after a concurrent request took one of them while it wrote.
# Each lost race means the other request committed (or rolled back) before ours could reserve, so the next look
# finds it (or the key free): a third loss in a row needs three racing requests with the same key.
DEDUP_ATTEMPTS = 3


@as_client_owner
def notification_accept(*, client: ApiClient, data: dict[str, Any], trace_id: str = "") -> AcceptResult:
    """Accept one validated request: decide, deduplicate, write in one transaction, publish after commit.

    `data` is the validated body of POST /notifications (see docs/api.md). Raises ApiError for an unknown template
    or topic (400), what notifier.accepting.policy.send_policy refuses (category and priority), a daily quota
    used up (429) and a reused dedup_key with another body (409).
    """
    (result,) = _accept(client, [data], [trace_id])
    if isinstance(result, ApiError):
        raise result
    return result


@as_client_owner
def notifications_accept_batch(
    *,
    client: ApiClient,
    items: list[dict[str, Any] | ApiError],
    trace_id: str = "",
    trace_ids: list[str] | None = None,
) -> list[AcceptResult | ApiError]:
    """Accept many validated requests at once; return one result (or the error it would have had alone) per item.

    Each item is accepted exactly as notification_accept accepts it alone, in one transaction with the others
    and one statement per table. An item that is already an ApiError (it failed validation in the view) is passed
    through. `trace_ids` (one per item) stores each item's own trace id instead of the call's `trace_id` (group
    commit: the items are requests of their own).
    """
    return _accept(client, items, trace_ids if trace_ids is not None else [trace_id] * len(items))


def _accept(
    client: ApiClient, items: Sequence[dict[str, Any] | ApiError], traces: Sequence[str]
) -> list[AcceptResult | ApiError]:
    """Decide, deduplicate and write `items` in one transaction (the caller's, if it has one)."""
    results: list[AcceptResult | ApiError | None] = [None] * len(items)
    decided: list[AcceptItem] = []
    templates: dict[str, Any] = {}
    for index, item in enumerate(items):
        if isinstance(item, ApiError):
            results[index] = item
            continue
        try:
            decision = notification_decide(client=client, data=item, templates=templates)
        except ApiError as exc:
            results[index] = exc
            continue
        decided.append(AcceptItem(index, item, decision, new_notification_id(), traces[index]))

    fresh, repeats = _first_of_each_key(decided, results)
    keyed = [(item.decision.dedup_key, str(item.notification_id), item.decision.request_hash)
             for item in fresh if item.decision.dedup_key]  # fmt: skip
    held: set[str] | None = dedup.claim_many(client_id=client.pk, entries=keyed)
    claimed = [(key, nid) for key, nid, _ in keyed if key not in (held or ())]  # set in Redis by this call
    try:
        for _ in range(DEDUP_ATTEMPTS):
            # The first look asks the database only about keys Redis already held; after a lost race, about all.
            fresh = _without_duplicates(client, fresh, results, held=held)
            if not fresh:
                break
            try:
                # In the caller's transaction if it has one (group commit), else in one of the writer's own.
                for index, result in notifications_write(client=client, items=fresh).items():
                    results[index] = result
                fresh = []
                break
            except DedupRace:
                logger.info("dedup: a concurrent request took a key of %d items; looking again", len(fresh))
                held = None
        for left in fresh:
            results[left.index] = ApiError(
                409, "idempotency_conflict", "Concurrent requests are using this dedup_key; retry the request."
            )
    except BaseException:
        dedup.release_many(client_id=client.pk, entries=claimed)
        raise
    # A claim whose item was not written (a 409, a quota's 429, a lost race) is given back: a retry may write it.
    written = {str(r.notification.pk) for r in results if isinstance(r, AcceptResult) and not r.duplicate}
    dedup.release_many(client_id=client.pk, entries=[(key, nid) for key, nid in claimed if nid not in written])
    for index, earlier in repeats:
        first = results[earlier]
        results[index] = (
            AcceptResult(notification=first.notification, duplicate=True, deliveries=first.deliveries)
            if isinstance(first, AcceptResult)
            else first
        )
    return [r for r in results if r is not None]


def _conflict() -> ApiError:
    return ApiError(409, "idempotency_conflict", "This dedup_key was already used with a different request body.")


def _first_of_each_key(
    decided: list[AcceptItem], results: list[AcceptResult | ApiError | None]
) -> tuple[list[AcceptItem], list[tuple[int, int]]]:
    """Split items whose dedup_key an earlier item of the call has: the first wins, a later one is its duplicate.

    Returns the items to write and (index, index of the first) of the repeats; a repeat with another body gets its
    409 in `results`.
    """
    first: dict[str, tuple[int, str]] = {}
    repeats: list[tuple[int, int]] = []
    fresh: list[AcceptItem] = []
    for item in decided:
        key = item.decision.dedup_key
        if key and key in first:
            earlier, earlier_hash = first[key]
            if earlier_hash == item.decision.request_hash:
                repeats.append((item.index, earlier))
            else:
                results[item.index] = _conflict()
            continue
        if key:
            first[key] = (item.index, item.decision.request_hash)
        fresh.append(item)
    return fresh, repeats


def _without_duplicates(
    client: ApiClient,
    items: list[AcceptItem],
    results: list[AcceptResult | ApiError | None],
    *,
    held: set[str] | None,
) -> list[AcceptItem]:
    """Answer the items whose dedup_key an earlier request holds (its notification, or a 409); return the rest.

    The database is the truth (notifier/deliveries/dedup.py). `held`: look up only these keys (those Redis
    already held): a key Redis lost is still held by the table's primary key, where the writer's reservation
    finds it, and the next look up (`held` None) asks the database about every key.
    """
    keys = [item.decision.dedup_key for item in items if item.decision.dedup_key]
    if held is not None:
        keys = [key for key in keys if key in held]
    if not keys:
        return items
    # In a transaction, as the writer's reads (notifier/accepting/write.py says why).
    with transaction.atomic(savepoint=False):
        entries = dedup.lookup(client_id=client.pk, dedup_keys=keys)
        if not entries:
            return items
        existing = {
            n.dedup_key: n
            for n in Notification.objects.filter(
                pk__in=[e[0] for e in entries.values()], **_days_of(entries)
            ).order_by()
        }
        if not existing:
            return items
        known = _deliveries_of(list(existing.values()))
    kept = []
    for item in items:
        found = existing.get(item.decision.dedup_key or "")
        if found is None:
            kept.append(item)
        elif found.request_hash == item.decision.request_hash:
            found.client = client  # found under this client's key: the answer's `mode` needs no query
            results[item.index] = AcceptResult(notification=found, duplicate=True, deliveries=known[found.pk])
        else:
            results[item.index] = _conflict()
    return kept


@dataclass(frozen=True)
class AcceptRequest:
    """One single request waiting for group commit: its client, validated body and trace id."""

    client: ApiClient
    data: dict[str, Any]
    trace_id: str


def _accept_alone(request: AcceptRequest) -> AcceptResult:
    return notification_accept(client=request.client, data=request.data, trace_id=request.trace_id)


def notifications_accept_group(requests: Sequence[AcceptRequest]) -> list[AcceptResult | BaseException]:
    """Write concurrent single requests in one transaction and one commit; return each one's result or error.

    The requests of one client are accepted as a batch (notifications_accept_batch: the accept of a single, for
    all of them at once; a key repeated among them is the first one's duplicate or a 409), inside a savepoint
    when the group holds other clients' requests too (one client alone: `_accept_one_client_group`, none).
    If that batch fails for a reason other than one request's own 4xx, the savepoint is rolled back and each
    of its requests is accepted alone, each inside its own savepoint, so the one that fails gets its own error
    and the others are written. A failing COMMIT fails every request of the group, as it would have alone
    (none was written). Nothing is answered before the commit: accepted still means committed.
    """
    results: list[AcceptResult | BaseException | None] = [None] * len(requests)
    by_client: dict[int, list[int]] = {}
    for index, request in enumerate(requests):
        by_client.setdefault(request.client.pk, []).append(index)
    if len(by_client) == 1:
        return _accept_one_client_group(requests)
    try:
        with transaction.atomic():
            # Clients in id order, as keys are reserved in key order: concurrent groups lock in one order.
            for _, indices in sorted(by_client.items()):
                batch: list[AcceptResult | ApiError] | None = None
                try:
                    with transaction.atomic():
                        batch = notifications_accept_batch(
                            client=requests[indices[0]].client,
                            items=[requests[i].data for i in indices],
                            trace_ids=[requests[i].trace_id for i in indices],
                        )
                except Exception:
                    logger.warning("group commit: a batch of %d failed, accepting each alone", len(indices))
                if batch is not None:
                    for index, result in zip(indices, batch, strict=True):
                        results[index] = result
                    continue
                for index in indices:
                    try:
                        with transaction.atomic():
                            results[index] = _accept_alone(requests[index])
                    except Exception as exc:  # this request's own error, answered to it alone
                        results[index] = exc
    except Exception as exc:  # the commit (or the connection) failed: nothing of the group was written
        return [exc] * len(requests)
    return [r if r is not None else RuntimeError("not accepted") for r in results]


def _accept_one_client_group(requests: Sequence[AcceptRequest]) -> list[AcceptResult | BaseException]:
    """Write the requests of one client as one batch in one transaction, without a savepoint.

    The common group (one calling service): the transaction holds nothing but this batch, so a batch that
    fails for a reason other than one request's own 4xx rolls the whole transaction back, and each request is
    then accepted alone, in a transaction of its own. A failing COMMIT fails every request of the group, as
    it would have alone (none was written).
    """
    client = requests[0].client
    failed_inside = False
    try:
        with transaction.atomic():
            try:
                batch = notifications_accept_batch(
                    client=client, items=[r.data for r in requests], trace_ids=[r.trace_id for r in requests]
                )
            except Exception:
                failed_inside = True
                raise
    except Exception as exc:
        if not failed_inside:
            return [exc] * len(requests)
        logger.warning("group commit: a batch of %d failed, accepting each alone", len(requests))
        alone: list[AcceptResult | BaseException] = []
        for request in requests:
            try:
                alone.append(_accept_alone(request))
            except Exception as error:  # this request's own error, answered to it alone
                alone.append(error)
        return alone
    return list(batch)


_group = GroupCommit(
    write_one=_accept_alone,
    write_group=notifications_accept_group,
    max_size=settings.ACCEPT_GROUP_MAX,
)


def notification_accept_grouped(*, client: ApiClient, data: dict[str, Any], trace_id: str = "") -> AcceptResult:
    """Accept one request as notification_accept does, sharing a transaction with concurrent ones (group commit).

    Alone (no accept writing in this process right now) it is notification_accept itself. Inside a transaction
    of the caller's (tests, scripts) it is too: a group is written on another thread's connection, which would
    not see the caller's uncommitted rows. ACCEPT_GROUP_COMMIT=false turns grouping off.
    """
    if not settings.ACCEPT_GROUP_COMMIT or transaction.get_connection().in_atomic_block:
        return notification_accept(client=client, data=data, trace_id=trace_id)
    return _group.submit(AcceptRequest(client=client, data=data, trace_id=trace_id))


def accept_group() -> GroupCommit[AcceptRequest, AcceptResult]:
    """Return this process's group committer (its counters; tests)."""
    return _group


def _days_of(entries: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """Return the created_at filter covering the notifications of these key entries (their UUIDv7 days)."""
    ranges: list[tuple[datetime, datetime]] = []
    for notification_id, _ in entries.values():
        bounds = notification_range(notification_id)
        if bounds is None:
            return {}  # an id from before the partitioning says nothing about its day
        ranges.append(bounds)
    if not ranges:
        return {}
    return {"created_at__gte": min(r[0] for r in ranges), "created_at__lte": max(r[1] for r in ranges)}


def _deliveries_of(notifications: list[Notification]) -> dict[uuid.UUID, list[Delivery]]:
    """Return the deliveries of each notification (one query)."""
    by_notification: dict[uuid.UUID, list[Delivery]] = {n.pk: [] for n in notifications}
    for delivery in Delivery.objects.filter(notification__in=[n.pk for n in notifications]).order_by("id"):
        by_notification[delivery.notification_id].append(delivery)
    return by_notification


@as_client_owner
def notification_accept_prepared(
    *, client: ApiClient, notification: Notification, prepare: Callable[[Notification], list[Delivery]]
) -> AcceptResult:
    """Deduplicate a decided, unsaved notification and write it with `prepare(notification)` in one transaction.

    The dedup rules of every accept (the notification's dedup_key and request_hash): a committed duplicate is
    returned instead, the same key with another body is a 409. `prepare` writes the notification and what
    belongs to it (deliveries, a workflow's runs) and returns its deliveries; it runs inside the transaction.
    """
    return _accept_prepared(client=client, notification=notification, prepare=prepare)


def _accept_prepared(
    *, client: ApiClient, notification: Notification, prepare: Callable[[Notification], list[Delivery]]
) -> AcceptResult:
    """Deduplicate and write as notification_accept_prepared does, in the owner scope its caller has entered."""
    request_hash, dedup_key = notification.request_hash, notification.dedup_key
    notification_id = notification.pk
    if dedup_key:
        won, existing = dedup.claim(
            client_id=client.pk, dedup_key=dedup_key, notification_id=str(notification_id), request_hash=request_hash
        )
        if not won:
            found = _existing_duplicate(client=client, dedup_key=dedup_key, request_hash=request_hash, hint=existing)
            if found is not None:
                return found

    try:
        with transaction.atomic():
            if dedup_key and not dedup.reserve(
                client_id=client.pk, entries=[(dedup_key, str(notification_id), request_hash)]
            ):
                # A live entry holds the key (we waited for its transaction): the first request wins.
                raise IntegrityError("dedup_key already taken")
            deliveries = prepare(notification)
    except IntegrityError:
        # Another request with the same dedup_key committed first (we waited on its row lock): it wins.
        if dedup_key:
            dedup.release(client_id=client.pk, dedup_key=dedup_key, notification_id=str(notification_id))
            found = _existing_duplicate(client=client, dedup_key=dedup_key, request_hash=request_hash, hint=None)
            if found is not None:
                return found
        raise
    except BaseException:
        if dedup_key:
            dedup.release(client_id=client.pk, dedup_key=dedup_key, notification_id=str(notification_id))
        raise
    metrics.count_accepted(notification.category, client.name, client.mode)
    return AcceptResult(notification=notification, duplicate=False, deliveries=deliveries)


def _existing_duplicate(
    *, client: ApiClient, dedup_key: str, request_hash: str, hint: str | None
) -> AcceptResult | None:
    """Return the committed notification for `dedup_key`, a 409 if its body differs, or None if there is none."""
    if hint and "|" in hint and hint.split("|", 1)[1] != request_hash:
        raise ApiError(409, "idempotency_conflict", "This dedup_key was already used with a different request body.")
    entry = dedup.lookup(client_id=client.pk, dedup_keys=[dedup_key]).get(dedup_key)
    if entry is None:
        # The first request has not committed (or failed), or the window has passed: the insert path decides,
        # waiting on the key table's primary key.
        return None
    if entry[1] != request_hash:
        raise ApiError(409, "idempotency_conflict", "This dedup_key was already used with a different request body.")
    existing = Notification.objects.filter(pk=entry[0]).first()
    if existing is None:
        return None
    if existing.request_hash != request_hash:
        raise ApiError(409, "idempotency_conflict", "This dedup_key was already used with a different request body.")
    existing.client = client  # found under this client's key: the answer's `mode` needs no query
    return AcceptResult(
        notification=existing, duplicate=True, deliveries=list(existing.day_deliveries().order_by("id"))
    )


def topic_notification_write(notification: Notification, topic_key: str) -> list[Delivery]:
    """Write a topic notification; the fan-out task creates what it sends (deliveries, runs) after commit."""
    topic = Topic.objects.filter(key=topic_key).first()
    if topic is None:
        raise topic_unknown(topic_key)
    notification.topic = topic
    notification.status = Notification.Status.FANNING_OUT
    notification.save(force_insert=True)
    transaction.on_commit(lambda: fanout_start(notification_id=notification.pk))
    return []


def notification_cancel(*, notification: Notification) -> int:
    """Cancel the deliveries of a notification that are not yet sent; return how many were cancelled."""
    ids = list(notification.deliveries.filter(status__in=CANCELLABLE).values_list("id", flat=True))
    moved = transition(ids, to=Delivery.Status.CANCELLED, detail="cancelled by client", only_from=CANCELLABLE)
    if notification.status != Notification.Status.DONE:
        Notification.objects.filter(pk=notification.pk).update(status=Notification.Status.CANCELLED)
    return len(moved)
