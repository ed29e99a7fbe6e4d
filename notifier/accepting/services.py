"""Accepting notifications and cancelling them.

Accepting is the hot path: validate, deduplicate, resolve recipients and their preferences, write the
notification with its deliveries in one transaction, publish after commit. No provider is ever called here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from core import metrics
from core.db import InstanceBuilder
from core.errors import ApiError
from core.group_commit import GroupCommit
from notifier.accepting.policy import send_policy
from notifier.clients.models import ApiClient
from notifier.deliveries import dedup, fallback, frequency
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.outbox import publish_soon
from notifier.deliveries.partitions import new_notification_id, notification_range, uuid7
from notifier.deliveries.planning import channel_addresses, delivery_plan
from notifier.deliveries.status import deliveries_insert, transition
from notifier.dispatch import localtime
from notifier.dispatch.fanout import fanout_start
from preferences.compliance import suppressed_addresses
from preferences.models import CHANNEL_ADDRESS_USER_ID, Device, Recipient, Topic
from preferences.selectors import recipients_for_send, topic_subscriber_count
from preferences.services import recipient_ensure
from projects.quotas import Taken, quota_refund, quota_take, quotas_of
from projects.scoping import as_client_owner, owner_id
from templates_app.models import TemplateVersion
from templates_app.selectors import TemplateNotFound, template_version_cached

logger = logging.getLogger(__name__)

# The accept's new rows, built without Model.__init__ (core.db.InstanceBuilder says why).
_notifications = InstanceBuilder(Notification)
_deliveries = InstanceBuilder(Delivery)

CANCELLABLE = (Delivery.Status.SCHEDULED, Delivery.Status.DEFERRED, Delivery.Status.QUEUED, Delivery.Status.PENDING)


@dataclass
class AcceptResult:
    """The outcome of accepting one request."""

    notification: Notification
    duplicate: bool
    deliveries: list[Delivery] = field(default_factory=list)


def request_fingerprint(data: dict[str, Any]) -> str:
    """Return a stable hash of a request body, to tell a retry (same body) from a conflict (other body)."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def category_settings(category: str) -> dict[str, Any]:
    """Return the configured rules of a category."""
    return dict(settings.NOTIFIER_CATEGORIES[category])


@dataclass(frozen=True)
class AcceptDecision:
    """What accepting one request decided before anything is written: the single and batch paths share it."""

    category: str
    priority: str
    version: TemplateVersion
    channels: list[str]
    request_hash: str
    dedup_key: str | None


def notification_decide(
    *, client: ApiClient, data: dict[str, Any], templates: dict[str, Any] | None = None
) -> AcceptDecision:
    """Decide the category, template version, channels and priority of one validated request.

    The one place these per-item rules live: POST /notifications and each item of POST /notifications/batch
    both come here. The category and priority are notifier.accepting.policy's decision (the template decides the
    category; the category caps the priority). Raises ApiError for an unknown template or a channel the
    template has no content for (400) and for what send_policy refuses. `templates` memoizes template
    resolution for the length of one call (a batch resolves each template spec once).
    """
    spec = data["template"]
    try:
        # Resolved once per process until a template changes (notifier/lookup_cache.py).
        if templates is None:
            version = template_version_cached(spec, environment_id=owner_id(client))
        else:
            if spec not in templates:
                try:
                    templates[spec] = template_version_cached(spec, environment_id=owner_id(client))
                except TemplateNotFound as exc:
                    templates[spec] = exc
            found = templates[spec]
            if isinstance(found, TemplateNotFound):
                raise found
            version = found
    except TemplateNotFound as exc:
        raise ApiError(400, "invalid", str(exc), {"template": [str(exc)]}) from None
    category, priority = send_policy(
        client=client, template_category=version.template.category, category=data.get("category"),
        priority=data.get("priority"),
    )  # fmt: skip
    return AcceptDecision(
        category=category,
        priority=priority,
        version=version,
        channels=channels_decide(data.get("channels"), version.channels, template_key=version.template.key),
        request_hash=request_fingerprint(data),
        dedup_key=data.get("dedup_key") or None,
    )


def channels_decide(
    requested: Sequence[str] | None, template_channels: Sequence[str], *, template_key: str
) -> list[str]:
    """Return the channels of a send, in order, each once: those asked for, else the template's.

    The order is a fallback chain's order of steps. Raises ApiError (400) for a channel the template has no
    content for.
    """
    channels = list(dict.fromkeys(requested or template_channels))
    missing = [c for c in channels if c not in template_channels]
    if missing:
        message = f"Template '{template_key}' has no content for channel(s): {', '.join(missing)}."
        raise ApiError(400, "invalid", message, {"channels": [message]})
    return channels


def _new_notification(
    *, client: ApiClient, decision: AcceptDecision, data: dict[str, Any], notification_id: uuid.UUID, trace_id: str
) -> Notification:
    return _notifications.new(
        id=notification_id,
        client=client,
        environment_id=client.environment_id,
        dedup_key=decision.dedup_key,
        request_hash=decision.request_hash,
        category=decision.category,
        template_key=decision.version.template.key,
        template_version=decision.version.version,
        channels=decision.channels,
        payload=data.get("payload") or {},
        priority=decision.priority,
        locale=data.get("locale") or "",
        send_at=data.get("send_at"),
        send_at_local=data.get("send_at_local") or "",
        trace_id=trace_id,
        **fallback.notification_fields(data),
    )


@as_client_owner
def notification_accept(*, client: ApiClient, data: dict[str, Any], trace_id: str = "") -> AcceptResult:
    """Accept one validated request: deduplicate, resolve, write in one transaction, publish after commit.

    `data` is the validated body of POST /notifications (see docs/api.md). Raises ApiError for an unknown template
    (400), what notifier.accepting.policy.send_policy refuses (category and priority) and a reused dedup_key with
    another body (409).
    """
    decision = notification_decide(client=client, data=data)
    notification = _new_notification(
        client=client, decision=decision, data=data, notification_id=new_notification_id(), trace_id=trace_id
    )
    # The environment's daily quotas on the send's channels (projects.quotas; cached, no query): none, no Redis call.
    limits = quotas_of(owner_id(client))
    counted = bool(limits) and any(channel in limits for channel in decision.channels)
    taken: list[Taken] = []

    def prepare(n: Notification) -> list[Delivery]:
        if data.get("topic"):
            deliveries = topic_notification_write(n, data["topic"])
            if counted:  # every subscriber, on each of the send's channels, as the fan-out will plan them
                _quota_take_one(client, n, topic_subscriber_count(topic=cast(Topic, n.topic)), taken)
            return deliveries
        if counted:  # after the dedup check: a duplicate takes nothing
            _quota_take_one(client, n, 1, taken)
        if "chat" in data["recipient"]:
            return _prepare_chat_address(n, data["recipient"]["chat"])
        return _prepare_user(n, data["recipient"]["user_id"])

    try:
        # Already the client's owner (as_client_owner above): the body without the wrapper's second scope.
        return _accept_prepared(client=client, notification=notification, prepare=prepare)
    except BaseException:
        for entry in taken:
            quota_refund(entry)  # not written: what it counted is given back
        raise


def _quota_take_one(client: ApiClient, notification: Notification, recipients: int, taken: list[Taken]) -> None:
    """Count a notification's messages (`recipients` on each of its channels) or raise its 429 quota_exceeded."""
    (refused,), counted = quota_take(owner_id(client), [dict.fromkeys(notification.channels, recipients)])
    if refused is not None:
        raise refused
    taken.append(counted)


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


def _conflict() -> ApiError:
    return ApiError(409, "idempotency_conflict", "This dedup_key was already used with a different request body.")


@as_client_owner
def notifications_accept_batch(
    *,
    client: ApiClient,
    items: list[dict[str, Any] | ApiError],
    trace_id: str = "",
    trace_ids: list[str] | None = None,
) -> list[AcceptResult | ApiError]:
    """Accept many validated requests at once; return one result (or the error it would have had alone) per item.

    Each item is decided by `notification_decide`, as a single request is, and deduplicated the same way:
    a dedup_key seen earlier in the batch or in an earlier request with the same body is that notification
    (200), with another body a 409. The new ones are written with one statement per table (notifications,
    deliveries, events) in one transaction and published once after commit, as batches per queue. An item
    that is already an ApiError (it failed validation in the view) is passed through. Topic items take the
    single path (their fan-out is a task of its own). If a concurrent request takes one of the dedup_keys
    while the batch commits, the batch is replayed item by item through the single path, which resolves it.
    `trace_ids` (one per item) stores each item's own trace id instead of the call's `trace_id` (group commit:
    the items are requests of their own).
    """
    traces = trace_ids if trace_ids is not None else [trace_id] * len(items)
    results: list[AcceptResult | ApiError | None] = [None] * len(items)
    fresh: list[tuple[int, dict[str, Any], AcceptDecision]] = []
    templates: dict[str, Any] = {}
    for index, item in enumerate(items):
        if isinstance(item, ApiError):
            results[index] = item
            continue
        try:
            if item.get("topic") or "chat" in item["recipient"]:
                # A topic's fan-out and a chat address's holder recipient are the single path's.
                results[index] = notification_accept(client=client, data=item, trace_id=traces[index])
                continue
            decision = notification_decide(client=client, data=item, templates=templates)
            if _decided_per_recipient(item, decision):
                results[index] = notification_accept(client=client, data=item, trace_id=traces[index])
                continue
            fresh.append((index, item, decision))
        except ApiError as exc:
            results[index] = exc

    # The same dedup_key twice in this batch: the first item wins, a later one is its duplicate (or a 409).
    first: dict[str, tuple[int, str]] = {}
    repeats: list[tuple[int, int]] = []
    new: list[tuple[int, dict[str, Any], AcceptDecision]] = []
    for index, item, decision in fresh:
        key = decision.dedup_key
        if key and key in first:
            earlier, earlier_hash = first[key]
            if earlier_hash == decision.request_hash:
                repeats.append((index, earlier))
            else:
                results[index] = _conflict()
            continue
        if key:
            first[key] = (index, decision.request_hash)
        new.append((index, item, decision))

    # Keys used by earlier requests: the database is the truth.
    if first:
        entries = dedup.lookup(client_id=client.pk, dedup_keys=list(first))
        # Mostly none (fresh keys): then not even a queryset is built, which cost a group commit 4 % of the API.
        existing = (
            {
                n.dedup_key: n
                for n in Notification.objects.filter(
                    pk__in=[e[0] for e in entries.values()], **_days_of(entries)
                ).order_by()
            }
            if entries
            else {}
        )
        if existing:
            known = _deliveries_of(list(existing.values()))
            kept = []
            for index, item, decision in new:
                found = existing.get(decision.dedup_key or "")
                if found is None:
                    kept.append((index, item, decision))
                elif found.request_hash == decision.request_hash:
                    found.client = client  # the answer's `mode` is this client's
                    results[index] = AcceptResult(notification=found, duplicate=True, deliveries=known[found.pk])
                else:
                    results[index] = _conflict()
            new = kept

    if new:
        try:
            written: dict[int, AcceptResult | ApiError] = dict(_write_batch(client=client, items=new, traces=traces))
        except IntegrityError:
            # A concurrent request committed one of these dedup_keys first: the single path sorts each out.
            written = {}
            for index, item, _ in new:
                try:
                    written[index] = notification_accept(client=client, data=item, trace_id=traces[index])
                except ApiError as exc:
                    written[index] = exc
        for index, result in written.items():
            results[index] = result
    for index, earlier in repeats:
        first_result = results[earlier]
        if isinstance(first_result, AcceptResult):
            results[index] = AcceptResult(
                notification=first_result.notification, duplicate=True, deliveries=first_result.deliveries
            )
        else:
            results[index] = first_result
    return [r for r in results if r is not None]


# The fields of a single request the batch writer knows. A request with any other field (one added later, with a
# rule of its own in notification_accept) is written alone, never by the group writer.
GROUPABLE_FIELDS = frozenset(
    {
        "recipient", "topic", "category", "template", "channels", "payload", "dedup_key", "priority", "locale",
        "send_at", "send_at_local", "strategy", "fallback_until", "fallback_after_seconds",
    }
)  # fmt: skip


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

    The requests of one client are accepted as a batch (notifications_accept_batch: one statement per table,
    the same dedup rules: a key repeated among them is the first one's duplicate or a 409), inside a savepoint
    when the group holds other clients' requests too (one client alone: `_accept_one_client_group`, none).
    If that batch fails for a reason other than one request's own 4xx, the savepoint is rolled back and each
    of its requests is accepted alone, each inside its own savepoint, so the one that fails gets its own error
    and the others are written. A failing COMMIT fails every request of the group, as it would have alone
    (none was written). Nothing is answered before the commit: accepted still means committed.
    """
    results: list[AcceptResult | BaseException | None] = [None] * len(requests)
    by_client: dict[int, list[int]] = {}
    for index, request in enumerate(requests):
        if set(request.data) <= GROUPABLE_FIELDS:
            by_client.setdefault(request.client.pk, []).append(index)
        else:
            by_client.setdefault(-1 - index, []).append(index)  # a group of its own: written alone
    if len(by_client) == 1 and next(iter(by_client)) >= 0:
        return _accept_one_client_group(requests)
    try:
        with transaction.atomic():
            # Clients in id order, as keys are reserved in key order: concurrent groups lock in one order.
            for _, indices in sorted(by_client.items()):
                batch: list[AcceptResult | ApiError] | None = None
                if len(indices) > 1:
                    client = requests[indices[0]].client
                    try:
                        with transaction.atomic():
                            batch = notifications_accept_batch(
                                client=client,
                                items=[requests[i].data for i in indices],
                                trace_ids=[requests[i].trace_id for i in indices],
                            )
                    except Exception:
                        logger.warning("group commit: a batch of %d failed, accepting each alone", len(indices))
                        batch = None
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


def _decided_per_recipient(item: dict[str, Any], decision: AcceptDecision) -> bool:
    """Return True for an item whose accept needs per-recipient decisions the bulk writer does not make.

    A fallback chain, a local send time and a category's frequency cap are decided against one recipient
    inside its own accept transaction (notifier/fallback.py, localtime.py, frequency.py); such items take
    the single path, exactly as a single request would, and the bulk writer stays one statement per table.
    """
    return (
        item.get("strategy") == fallback.FALLBACK
        or bool(item.get("send_at_local"))
        or frequency.cap_of(decision.category) is not None
    )


def _deliveries_of(notifications: list[Notification]) -> dict[uuid.UUID, list[Delivery]]:
    """Return the deliveries of each notification (one query)."""
    by_notification: dict[uuid.UUID, list[Delivery]] = {n.pk: [] for n in notifications}
    for delivery in Delivery.objects.filter(notification__in=[n.pk for n in notifications]).order_by("id"):
        by_notification[delivery.notification_id].append(delivery)
    return by_notification


def _write_batch(
    *, client: ApiClient, items: list[tuple[int, dict[str, Any], AcceptDecision]], traces: list[str]
) -> dict[int, AcceptResult | ApiError]:
    """Count the items against the daily quotas, then write those within them (`_write_rows`).

    One quota call for the whole batch (one Redis round trip, none without quotas on the items' channels):
    an item over a quota fails alone with its 429. If the write fails, what was counted is given back.
    """
    limits = quotas_of(owner_id(client))
    if not limits or not any(c in limits for _, _, decision in items for c in decision.channels):
        return dict(_write_rows(client=client, items=items, traces=traces))
    answers, taken = quota_take(owner_id(client), [dict.fromkeys(decision.channels, 1) for _, _, decision in items])
    refused: dict[int, AcceptResult | ApiError] = {
        index: error for (index, _, _), error in zip(items, answers, strict=True) if error is not None
    }
    within = [entry for entry in items if entry[0] not in refused]
    try:
        written = _write_rows(client=client, items=within, traces=traces) if within else {}
    except BaseException:
        quota_refund(taken)
        raise
    return {**written, **refused}


def _write_rows(
    *, client: ApiClient, items: list[tuple[int, dict[str, Any], AcceptDecision]], traces: list[str]
) -> dict[int, AcceptResult]:
    """Write new single-recipient notifications, their deliveries and events: one statement per table."""
    now = timezone.now()
    user_ids = {item["recipient"]["user_id"] for _, item, _ in items}
    recipients = recipients_for_send(user_ids=user_ids)
    missing = user_ids - set(recipients)
    if missing:
        # Users the service has not heard of get a bare recipient, as on the single path.
        Recipient.objects.bulk_create(
            [Recipient(user_id=u, environment_id=client.environment_id) for u in sorted(missing)],
            ignore_conflicts=True,
        )
        recipients.update(recipients_for_send(user_ids=missing))
    tokens: dict[int, list[str]] = {}
    if any("push" in decision.channels for _, _, decision in items):
        devices = Device.objects.filter(recipient__in=[r.pk for r in recipients.values()], active=True)
        for recipient_id, token in devices.values_list("recipient_id", "token"):
            tokens.setdefault(recipient_id, []).append(token)

    planned: list[tuple[int, Notification, list[tuple[str, str]]]] = []
    pairs: list[tuple[str, str]] = []
    for index, item, decision in items:
        recipient = recipients[item["recipient"]["user_id"]]
        notification = _new_notification(
            client=client, decision=decision, data=item, notification_id=uuid7(now), trace_id=traces[index]
        )
        notification.recipient = recipient
        notification.user_id = recipient.user_id
        targets = [
            (channel, address)
            for channel in notification.channels
            for address in channel_addresses(
                recipient, channel, webhook_default=client.webhook_url, tokens=tokens.get(recipient.pk, [])
            )
        ]
        pairs.extend(targets)
        planned.append((index, notification, targets))
    dead = suppressed_addresses(pairs)

    deliveries_by_index: dict[int, list[Delivery]] = {}
    all_deliveries: list[Delivery] = []
    for index, notification, targets in planned:
        recipient = cast(Recipient, notification.recipient)  # set on every planned notification above
        rows = deliveries_plan(notification, recipient, targets, now, dead=dead)
        deliveries_by_index[index] = rows
        all_deliveries.extend(rows)
    # No savepoint inside a caller's transaction (group commit): the keys of a lost race are given back by
    # hand and the error raised once the block has ended cleanly, so the caller's transaction stays usable
    # for the replay. Two statements a group fewer (SAVEPOINT, RELEASE), each a round trip.
    taken = False
    with transaction.atomic(savepoint=False):
        # In key order: two writers reserving overlapping keys then wait for each other, never deadlock.
        keyed = sorted((n.dedup_key, str(n.pk), n.request_hash) for _, n, _ in planned if n.dedup_key)
        won = dedup.reserve(client_id=client.pk, entries=keyed) if keyed else set()
        if len(won) < len(keyed):
            dedup.unreserve(client_id=client.pk, entries=[entry for entry in keyed if entry[0] in won])
            taken = True
        else:
            deliveries_insert(all_deliveries, at=now, notifications=[n for _, n, _ in planned])
            to_publish = [(d.pk, d.channel, d.priority) for d in all_deliveries if d.status == Delivery.Status.QUEUED]
            if to_publish:
                transaction.on_commit(lambda: publish_soon(to_publish))
    if taken:
        # A concurrent request holds one of the keys: the caller replays the items on the single path.
        raise IntegrityError("dedup_key already taken")
    results = {}
    accepted: Counter[str] = Counter()
    for index, notification, _ in planned:
        accepted[notification.category] += 1
        results[index] = AcceptResult(notification=notification, duplicate=False, deliveries=deliveries_by_index[index])
    for category, count in accepted.items():  # a labelled counter's lookup per category, not per item
        metrics.count_accepted(category, client.name, client.mode, n=count)
    dedup.remember([(client.pk, n.dedup_key, str(n.pk), n.request_hash) for _, n, _ in planned if n.dedup_key])
    return results


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
        raise ApiError(400, "invalid", f"Unknown topic '{topic_key}'.", {"topic": ["Unknown topic."]})
    notification.topic = topic
    notification.status = Notification.Status.FANNING_OUT
    notification.save(force_insert=True)
    transaction.on_commit(lambda: fanout_start(notification_id=notification.pk))
    return []


def _prepare_user(notification: Notification, user_id: str) -> list[Delivery]:
    """Write a single-recipient notification with one delivery per (channel, address); publish after commit."""
    # A user the service has not heard of yet gets a bare recipient: in-app still works, and channels that
    # need contact data are reported as suppressed with reason no_address instead of failing the request.
    recipient = recipient_ensure(user_id=user_id)
    notification.recipient = recipient
    notification.user_id = user_id
    now = timezone.now()
    localtime.apply_to_single(notification, recipient)  # send_at_local in the recipient's time zone
    targets = [
        (channel, address)
        for channel in notification.channels
        for address in channel_addresses(recipient, channel, webhook_default=notification.client.webhook_url)
    ]
    return _write_single(notification, recipient, targets, now, capped=True)


def _prepare_chat_address(notification: Notification, chat: dict[str, str]) -> list[Delivery]:
    """Write a notification to a team's chat address (no user): one delivery per network, no preferences.

    The deliveries hang on the environment's holder recipient (CHANNEL_ADDRESS_USER_ID), which has no preferences,
    quiet hours or frequency allowance; the suppression list still applies (an archived channel stays off).
    """
    recipient = recipient_ensure(user_id=CHANNEL_ADDRESS_USER_ID)
    notification.recipient = recipient
    notification.user_id = ""
    targets = [(channel, chat.get(channel, "")) for channel in notification.channels]
    return _write_single(notification, recipient, targets, timezone.now(), capped=False)


def _write_single(
    notification: Notification, recipient: Recipient, targets: list[tuple[str, str]], now: datetime, *, capped: bool
) -> list[Delivery]:
    """Plan and write one notification's deliveries to `targets`, publishing the queued ones after commit.

    `capped`: the category's per-recipient frequency cap applies (a person's allowance; not a team's channel).
    """
    deliveries = recipient_decide(
        notification, recipient, targets, now, dead=suppressed_addresses(targets), capped=capped
    )
    # One statement for the notification, its deliveries and their events, as the batch path (the ORM's INSERT
    # compilation was a tenth of an accept's CPU, and each statement is a round trip).
    deliveries_insert(deliveries, at=now, notifications=[notification])
    fallback.after_accept(notification, deliveries, now)
    to_publish = [(d.pk, d.channel, d.priority) for d in deliveries if d.status == Delivery.Status.QUEUED]
    if to_publish:
        transaction.on_commit(lambda: publish_soon(to_publish))
    return deliveries


def recipient_decide(
    notification: Notification,
    recipient: Recipient,
    targets: Sequence[tuple[str, str]],
    now: datetime,
    *,
    dead: set[tuple[str, str]],
    capped: bool,
) -> list[Delivery]:
    """Decide what one recipient gets of a single-recipient notification: its deliveries, unsaved, in first statuses.

    Compliance and the send time (`deliveries_plan`), then the category's frequency cap when `capped`, then the
    fallback chain, whose later steps wait as pending. `dead` holds the targets on the suppression list. Queries
    nothing, except the cap's counter for a capped category with a delivery that would go
    (notifier/deliveries/frequency.py).
    """
    deliveries = deliveries_plan(notification, recipient, targets, now, dead=dead)
    if capped:
        # Smarter delivery hooks (notifier/deliveries/frequency.py): the category's per-recipient cap.
        frequency.apply_at_accept(notification, recipient, deliveries)
    # ... and fallback between channels (notifier/fallback.py): later steps wait as pending.
    fallback.plan_at_accept(notification, deliveries, now)
    return deliveries


def deliveries_plan(
    notification: Notification,
    recipient: Recipient,
    targets: Sequence[tuple[str, str]],
    now: datetime,
    *,
    dead: set[tuple[str, str]],
) -> list[Delivery]:
    """Return a notification's new deliveries to `targets` (channel, address), each in the status planning decides.

    A notification whose send_at is ahead of `now` is marked scheduled. `dead` holds the targets on the
    suppression list (`suppressed_addresses`, looked up by the caller for many at once); no query here.
    """
    if notification.send_at and notification.send_at > now:
        notification.status = Notification.Status.SCHEDULED
    return [
        _plan_delivery(notification, recipient, channel, address, now, suppressed=(channel, address) in dead)
        for channel, address in targets
    ]


def _plan_delivery(
    notification: Notification,
    recipient: Recipient,
    channel: str,
    address: str,
    now: datetime,
    *,
    suppressed: bool | None = None,
) -> Delivery:
    """Build a new delivery in the first status delivery planning decides (notifier/deliveries/planning.py)."""
    plan = delivery_plan(
        recipient=recipient,
        category=notification.category,
        channel=channel,
        address=address,
        send_at=notification.send_at,
        now=now,
        suppressed=suppressed,
    )
    return _deliveries.new(
        notification=notification,
        environment_id=notification.environment_id,
        recipient=recipient,
        channel=channel,
        priority=notification.priority,
        address=address,
        status=plan.status,
        reason=plan.reason,
        not_before=plan.not_before,
    )


def notification_cancel(*, notification: Notification) -> int:
    """Cancel the deliveries of a notification that are not yet sent; return how many were cancelled."""
    ids = list(notification.deliveries.filter(status__in=CANCELLABLE).values_list("id", flat=True))
    moved = transition(ids, to=Delivery.Status.CANCELLED, detail="cancelled by client", only_from=CANCELLABLE)
    if notification.status != Notification.Status.DONE:
        Notification.objects.filter(pk=notification.pk).update(status=Notification.Status.CANCELLED)
    return len(moved)
