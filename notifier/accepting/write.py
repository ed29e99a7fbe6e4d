"""Writing accepted notifications: one writer for one request or a thousand.

A single, each group of singles (group commit) and each batch end here with their decided items
(notifier/accepting/decide.py) and fresh ids: the daily quotas are counted once for all of them, the recipients,
devices, topics and suppressions are read once for all of them, each recipient's deliveries are decided
(`recipient_decide`), and everything is written with one statement per table in the caller's transaction, where
the dedup keys are reserved first. What goes to a queue is published once, after commit.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from core import metrics
from core.db import InstanceBuilder
from core.errors import ApiError
from notifier.accepting.decide import AcceptDecision, recipient_decide
from notifier.clients.models import ApiClient
from notifier.deliveries import dedup, fallback, frequency
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.outbox import publish_soon
from notifier.deliveries.planning import channel_addresses
from notifier.deliveries.status import deliveries_insert
from notifier.dispatch import localtime
from notifier.dispatch.fanout import fanout_start
from preferences.compliance import suppressed_addresses
from preferences.models import CHANNEL_ADDRESS_USER_ID, Device, Recipient, Topic
from preferences.selectors import recipients_for_send, topic_subscriber_count
from projects.quotas import quota_refund, quota_take, quotas_of
from projects.scoping import owner_id

# The accept's new rows, built without Model.__init__ (core.db.InstanceBuilder says why).
_notifications = InstanceBuilder(Notification)


@dataclass
class AcceptResult:
    """The outcome of accepting one request."""

    notification: Notification
    duplicate: bool
    deliveries: list[Delivery] = field(default_factory=list)


@dataclass(frozen=True)
class AcceptItem:
    """One decided request on its way to the writer: its place in the call, body, decision, id and trace id."""

    index: int
    data: dict[str, Any]
    decision: AcceptDecision
    notification_id: uuid.UUID
    trace_id: str


class DedupRace(IntegrityError):
    """A concurrent request committed one of the dedup keys first; nothing of the items was written."""


def notifications_write(*, client: ApiClient, items: list[AcceptItem]) -> dict[int, AcceptResult | ApiError]:
    """Write new notifications (to a user, a chat address or a topic) in the caller's transaction; one result each.

    An item to an unknown topic is its own 400; an item over a daily quota its own 429 (one quota call for all of
    them, none without quotas on their channels). Raises DedupRace, having written nothing and given back what it
    counted, when a concurrent request holds one of the dedup keys (the caller looks them up again).
    """
    results: dict[int, AcceptResult | ApiError] = {}
    topics = _topics_of(items, results)
    items = [item for item in items if item.index not in results]
    if not items:
        return results
    limits = quotas_of(owner_id(client))
    if not limits or not any(c in limits for item in items for c in item.decision.channels):
        return {**results, **_write_rows(client=client, items=items, topics=topics)}
    counts = [
        dict.fromkeys(item.decision.channels, topic_subscriber_count(topic=topics[item.index]))
        if item.index in topics
        else dict.fromkeys(item.decision.channels, 1)
        for item in items
    ]
    answers, taken = quota_take(owner_id(client), counts)
    refused = {item.index: error for item, error in zip(items, answers, strict=True) if error is not None}
    within = [item for item in items if item.index not in refused]
    try:
        written = _write_rows(client=client, items=within, topics=topics) if within else {}
    except BaseException:
        quota_refund(taken)  # not written: what it counted is given back
        raise
    return {**results, **written, **refused}


def _topics_of(items: list[AcceptItem], results: dict[int, AcceptResult | ApiError]) -> dict[int, Topic]:
    """Return the topic of each topic item by index (one query); an unknown topic is the item's 400 in `results`."""
    keys = {item.data["topic"] for item in items if item.data.get("topic")}
    if not keys:
        return {}
    with transaction.atomic(savepoint=False):  # as _write_rows says: a failed read drops its connection
        found = {topic.key: topic for topic in Topic.objects.filter(key__in=keys)}
    topics = {}
    for item in items:
        key = item.data.get("topic")
        if not key:
            continue
        if key in found:
            topics[item.index] = found[key]
        else:
            results[item.index] = topic_unknown(key)
    return topics


def topic_unknown(key: str) -> ApiError:
    """Return the 400 of a send to a topic the project does not have."""
    return ApiError(400, "invalid", f"Unknown topic '{key}'.", {"topic": ["Unknown topic."]})


def _recipient_of(data: dict[str, Any]) -> str:
    """Return the user id whose recipient a (non-topic) item's deliveries hang on: a chat address's holder's."""
    return CHANNEL_ADDRESS_USER_ID if "chat" in data["recipient"] else data["recipient"]["user_id"]


def _recipients(client: ApiClient, items: list[AcceptItem], topics: dict[int, Topic]) -> dict[str, Recipient]:
    """Return the items' recipients by user id, creating a bare one for a user the service has not heard of.

    A bare recipient has no personal data: in-app still works, and channels that need contact data are reported
    as suppressed with reason no_address instead of failing the request.
    """
    user_ids = {_recipient_of(item.data) for item in items if item.index not in topics}
    recipients = recipients_for_send(user_ids=user_ids)
    missing = user_ids - set(recipients)
    if missing:
        Recipient.objects.bulk_create(
            [Recipient(user_id=u, environment_id=client.environment_id) for u in sorted(missing)],
            ignore_conflicts=True,
        )
        recipients.update(recipients_for_send(user_ids=missing))
    return recipients


def _new_notification(client: ApiClient, item: AcceptItem) -> Notification:
    """Build an item's notification, unsaved, with the fields its decision and body give."""
    decision, data = item.decision, item.data
    return _notifications.new(
        id=item.notification_id,
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
        trace_id=item.trace_id,
        **fallback.notification_fields(data),
    )


@dataclass
class _Planned:
    """One item's unsaved notification, its recipient (None for a topic) and its targets."""

    item: AcceptItem
    notification: Notification
    recipient: Recipient | None
    targets: list[tuple[str, str]]
    deliveries: list[Delivery] = field(default_factory=list)


def _plan(client: ApiClient, items: list[AcceptItem], topics: dict[int, Topic]) -> list[_Planned]:
    """Build each item's notification and targets, reading recipients and devices once for all of them."""
    recipients = _recipients(client, items, topics)
    tokens: dict[int, list[str]] = {}
    if any("push" in item.decision.channels and item.index not in topics for item in items):
        devices = Device.objects.filter(recipient__in=[r.pk for r in recipients.values()], active=True)
        for recipient_id, token in devices.values_list("recipient_id", "token"):
            tokens.setdefault(recipient_id, []).append(token)
    planned = []
    for item in items:
        notification = _new_notification(client, item)
        topic = topics.get(item.index)
        if topic is not None:
            # The fan-out plans and writes what it sends (deliveries, runs), page by page, after commit.
            notification.topic = topic
            notification.status = Notification.Status.FANNING_OUT
            planned.append(_Planned(item, notification, None, []))
            continue
        recipient = recipients[_recipient_of(item.data)]
        notification.recipient = recipient
        if "chat" in item.data["recipient"]:
            notification.user_id = ""
            chat = item.data["recipient"]["chat"]
            targets = [(channel, chat.get(channel, "")) for channel in notification.channels]
        else:
            notification.user_id = recipient.user_id
            localtime.apply_to_single(notification, recipient)  # send_at_local in the recipient's time zone
            targets = [
                (channel, address)
                for channel in notification.channels
                for address in channel_addresses(
                    recipient, channel, webhook_default=client.webhook_url, tokens=tokens.get(recipient.pk, [])
                )
            ]
        planned.append(_Planned(item, notification, recipient, targets))
    return planned


def _decide(planned: list[_Planned], now: datetime) -> None:
    """Decide each recipient's deliveries, counting a capped category's earlier admissions of this accept."""
    dead = suppressed_addresses([target for p in planned for target in p.targets])
    admitted: Counter[tuple[str, int]] = Counter()
    for p in planned:
        if p.recipient is None:
            continue
        # A person's allowance, not a team's channel: a chat address's holder recipient has no cap.
        capped = "chat" not in p.item.data["recipient"]
        key = (p.notification.category, p.recipient.pk)
        p.deliveries = recipient_decide(
            p.notification, p.recipient, p.targets, now, dead=dead, capped=capped, earlier=admitted[key]
        )
        if capped and frequency.counted_at_accept(p.notification.category, p.deliveries):
            admitted[key] += 1


def _write_rows(
    *, client: ApiClient, items: list[AcceptItem], topics: dict[int, Topic]
) -> dict[int, AcceptResult | ApiError]:
    """Reserve the items' dedup keys, decide their deliveries and write everything: one statement per table."""
    now = timezone.now()
    # No savepoint inside a caller's transaction (group commit): the keys of a lost race are given back by hand
    # and the error raised once the block has ended cleanly, so the caller's transaction stays usable for the
    # next attempt. Two statements fewer (SAVEPOINT, RELEASE), each a round trip. The reads are inside too: a
    # statement that fails in a transaction has its connection dropped when the rollback fails (a silent
    # database host), where one that fails in autocommit leaves it to the next request, to hang on again.
    lost = False
    with transaction.atomic(savepoint=False):
        planned = _plan(client, items, topics)
        # In key order: two writers reserving overlapping keys then wait for each other, never deadlock.
        keyed = sorted((p.notification.dedup_key, str(p.notification.pk), p.notification.request_hash)
                       for p in planned if p.notification.dedup_key)  # fmt: skip
        won = dedup.reserve(client_id=client.pk, entries=keyed) if keyed else set()
        if len(won) < len(keyed):
            dedup.unreserve(client_id=client.pk, entries=[entry for entry in keyed if entry[0] in won])
            lost = True
        else:
            # Decided after the keys are ours: a lost race spends no frequency allowance.
            _decide(planned, now)
            deliveries = [d for p in planned for d in p.deliveries]
            deliveries_insert(deliveries, at=now, notifications=[p.notification for p in planned])
            fallback.after_accept([(p.notification, p.deliveries) for p in planned], now)
            _publish_after_commit(planned, deliveries)
    if lost:
        raise DedupRace("dedup_key already taken")
    accepted: Counter[str] = Counter(p.notification.category for p in planned)
    for category, count in accepted.items():  # a labelled counter's lookup per category, not per item
        metrics.count_accepted(category, client.name, client.mode, n=count)
    return {p.item.index: AcceptResult(notification=p.notification, duplicate=False, deliveries=p.deliveries)
            for p in planned}  # fmt: skip


def _publish_after_commit(planned: list[_Planned], deliveries: list[Delivery]) -> None:
    """Publish the queued deliveries and start the topics' fan-outs once the transaction has committed."""
    to_publish = [(d.pk, d.channel, d.priority) for d in deliveries if d.status == Delivery.Status.QUEUED]
    if to_publish:
        transaction.on_commit(lambda: publish_soon(to_publish))
    for p in planned:
        if p.recipient is None:
            transaction.on_commit(partial(fanout_start, notification_id=p.notification.pk))
