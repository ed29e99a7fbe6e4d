"""Digests: fold the deliveries a recipient asked to receive hourly or daily into one message per channel.

The recipient's choice (hourly, daily) is a preference (preferences.compliance); the digest itself is a
notification with deliveries, so it is made here, by the app that owns them.

The pipeline parks such deliveries as `deferred` with reason "digest:<frequency>" and no `not_before` (so the
outbox relay leaves them alone). `digest_flush()` runs from beat; per group (`digest_group`: recipient, channel,
category) it creates one digest notification, pinned to the digest template's published version as any send
is, and one delivery, moves the originals to `digested`, and publishes the digest after commit (the delivery
row is the outbox: if that publish is missed, the relay sends it). While the digest template has no published
version, or no content for a channel, nothing of that is folded: the originals wait for a later flush rather
than becoming a digest that cannot be rendered.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.outbox import publish_delivery_ids
from notifier.deliveries.status import deliveries_digest
from preferences.compliance import DIGEST_FREQUENCIES
from preferences.queries import recipients_at_local_hour
from projects.scoping import owner_scope
from templates_app.models import TemplateVersion
from templates_app.selectors import TemplateNotFound, template_version_resolve

logger = logging.getLogger(__name__)

# Recipients handled per transaction: bounds lock time and transaction size on a large daily run.
RECIPIENTS_PER_BATCH = 500


def digest_template_key() -> str:
    """Return the template key digests are rendered with."""
    return getattr(settings, "DIGEST_TEMPLATE_KEY", "digest")


def is_digest(notification: Notification) -> bool:
    """Return whether a notification is itself a digest (so it is never folded into another one)."""
    return notification.template_key == digest_template_key() and "items" in (notification.payload or {})


def normalise_frequency(frequency: str) -> str:
    """Return the canonical frequency ("hourly_digest"/"daily_digest"); "hourly" and "daily" are accepted."""
    canonical = frequency if frequency.endswith("_digest") else f"{frequency}_digest"
    if canonical not in DIGEST_FREQUENCIES:
        raise ValueError(f"unknown digest frequency {frequency!r}")
    return canonical


def digest_group(delivery: Delivery) -> tuple[int, str, str]:
    """Return the digest a waiting delivery is folded into: one per (recipient, channel, category).

    The one place the grouping is decided; the digest belongs to its first item's client (`_digest_of`).
    """
    return (delivery.recipient_id, delivery.channel, delivery.notification.category)


def daily_digest_hour() -> int:
    """Return the local hour at which each recipient's daily digest is sent (DIGEST_DAILY_LOCAL_HOUR, 8)."""
    return int(getattr(settings, "DIGEST_DAILY_LOCAL_HOUR", 8))


def digest_flush(*, frequency: str, now: dt.datetime | None = None, local_hour: int | None = None) -> int:
    """Fold every waiting "digest:<frequency>" delivery created up to `now` into digests; return how many.

    With `local_hour`, a daily flush takes only the recipients whose local time is in that hour now: beat runs
    it every hour, so everyone gets their daily digest at that hour of their own day.

    Recipients are taken in batches; within a batch the originals are locked with SKIP LOCKED, so two flushes
    running at once (two beat processes) take disjoint rows and never fold one delivery twice.
    """
    frequency = normalise_frequency(frequency)
    cutoff = now or timezone.now()
    reason = f"digest:{frequency}"
    waiting = Delivery.objects.filter(
        status=Delivery.Status.DEFERRED, reason=reason, not_before__isnull=True, created_at__lte=cutoff
    )
    if frequency == "daily_digest" and local_hour is not None:
        waiting = waiting.filter(recipient_id__in=recipients_at_local_hour(cutoff, local_hour))
    created = 0
    # Each environment folds with its own digest template (a recipient belongs to one environment, so its
    # digests never mix test and live, or two projects).
    for environment_id in sorted(set(waiting.values_list("environment_id", flat=True).distinct())):
        with owner_scope(environment_id):
            created += _flush_environment(waiting.filter(environment_id=environment_id), frequency)
    if created:
        logger.info("digest flush %s: %d digests", frequency, created)
    return created


def _flush_environment(waiting: Any, frequency: str) -> int:
    """Fold the waiting deliveries of the scope's environment with its digest template; return how many digests."""
    try:
        # Resolved once per flush, as an accept resolves a send's template: the version is pinned on the
        # digest notification, which is what the send worker renders (an unpinned one matches no version).
        version = template_version_resolve(digest_template_key())
    except TemplateNotFound as exc:
        if waiting.exists():
            logger.error("digest flush %s: nothing folded, the digest template cannot be sent: %s", frequency, exc)
        return 0
    # A channel the template has no content for would only fail to render: its originals wait instead.
    unserved = sorted(set(waiting.exclude(channel__in=version.channels).values_list("channel", flat=True)))
    if unserved:
        logger.error("digest flush %s: template %s has no content for %s; those wait", frequency, version, unserved)
    waiting = waiting.filter(channel__in=version.channels)
    created = 0
    last_recipient = 0
    while True:
        recipient_ids = list(
            waiting.filter(recipient_id__gt=last_recipient)
            .order_by("recipient_id")
            .values_list("recipient_id", flat=True)
            .distinct()[:RECIPIENTS_PER_BATCH]
        )
        if not recipient_ids:
            break
        last_recipient = recipient_ids[-1]
        created += _flush_recipients(waiting, recipient_ids, frequency, version)
    return created


def _flush_recipients(waiting: Any, recipient_ids: list[int], frequency: str, version: TemplateVersion) -> int:
    """Create the digests of some recipients and retire their originals, in one transaction."""
    with transaction.atomic():
        originals = list(
            waiting.filter(recipient_id__in=recipient_ids)
            .select_related("notification", "recipient")
            .select_for_update(skip_locked=True, of=("self",))
            .order_by("recipient_id", "channel", "id")
        )
        groups: dict[tuple[int, str, str], list[Delivery]] = defaultdict(list)
        for delivery in originals:
            groups[digest_group(delivery)].append(delivery)
        if not groups:
            return 0

        notifications: list[Notification] = []
        deliveries: list[Delivery] = []
        for items in groups.values():
            notification, delivery = _digest_of(items, frequency, version)
            notifications.append(notification)
            deliveries.append(delivery)
        Notification.objects.bulk_create(notifications, batch_size=1000)
        Delivery.objects.bulk_create(deliveries, batch_size=1000)

        deliveries_digest(
            {digest.pk: [d.pk for d in items] for digest, items in zip(deliveries, groups.values(), strict=True)},
            at=timezone.now(),
        )
        new_ids = [d.pk for d in deliveries]
        transaction.on_commit(lambda: publish_delivery_ids(new_ids))
    return len(deliveries)


def _digest_of(items: list[Delivery], frequency: str, version: TemplateVersion) -> tuple[Notification, Delivery]:
    """Return the (unsaved) digest notification and delivery of one group's originals, oldest first."""
    first, latest = items[0], items[-1]
    notification = Notification(
        client_id=first.notification.client_id,
        # The recipient's environment: test and live, and two projects, never fold together.
        environment_id=first.environment_id,
        category=first.notification.category,
        template_key=version.template.key,
        template_version=version.version,
        channels=[first.channel],
        payload={
            "items": [{"template": d.notification.template_key, "payload": d.notification.payload} for d in items],
            "count": len(items),
            "frequency": frequency,
        },
        recipient_id=first.recipient_id,
        user_id=first.recipient.user_id,
        priority=first.priority or Notification.Priority.LOW,
        locale=first.notification.locale,
        trace_id=first.notification.trace_id,
    )
    # The newest original's address is the most current one the pipeline resolved.
    delivery = Delivery(
        notification=notification,
        environment_id=first.environment_id,
        recipient_id=first.recipient_id,
        channel=first.channel,
        priority=notification.priority,
        address=latest.address,
        status=Delivery.Status.QUEUED,
        reason="",
    )
    return notification, delivery
