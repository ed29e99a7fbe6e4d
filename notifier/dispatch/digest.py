"""Digests: fold the deliveries a recipient asked to receive hourly or daily into one message per channel.

The recipient's choice (hourly, daily) is a preference (preferences.compliance); the digest itself is a
notification with deliveries, so it is made here, by the app that owns them.

The pipeline parks such deliveries as `deferred` with reason "digest:<frequency>" and no `not_before` (so the
outbox relay leaves them alone). `digest_flush()` runs from beat; per (recipient, channel, category) it
creates one digest notification and delivery, moves the originals to `digested`, and publishes the digest
after commit (the delivery row is the outbox: if that publish is missed, the relay sends it).
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
        created += _flush_recipients(waiting, recipient_ids, frequency)
    if created:
        logger.info("digest flush %s: %d digests", frequency, created)
    return created


def _flush_recipients(waiting: Any, recipient_ids: list[int], frequency: str) -> int:
    """Create the digests of some recipients and retire their originals, in one transaction."""
    template_key = digest_template_key()
    with transaction.atomic():
        originals = list(
            waiting.filter(recipient_id__in=recipient_ids)
            .select_related("notification", "recipient")
            .select_for_update(skip_locked=True, of=("self",))
            .order_by("recipient_id", "channel", "id")
        )
        groups: dict[tuple[int, str, str], list[Delivery]] = defaultdict(list)
        for delivery in originals:
            groups[(delivery.recipient_id, delivery.channel, delivery.notification.category)].append(delivery)
        if not groups:
            return 0

        notifications: list[Notification] = []
        deliveries: list[Delivery] = []
        for (_, channel, category), items in groups.items():
            first, latest = items[0], items[-1]
            notification = Notification(
                client_id=first.notification.client_id,
                # The recipient's environment (a recipient belongs to one): test and live never fold together.
                environment_id=first.environment_id,
                category=category,
                template_key=template_key,
                channels=[channel],
                payload={
                    "items": [
                        {"template": d.notification.template_key, "payload": d.notification.payload} for d in items
                    ],
                    "count": len(items),
                    "frequency": frequency,
                },
                recipient_id=first.recipient_id,
                user_id=first.recipient.user_id,
                priority=first.priority or Notification.Priority.LOW,
                locale=first.notification.locale,
                trace_id=first.notification.trace_id,
            )
            notifications.append(notification)
            # The newest original's address is the most current one the pipeline resolved.
            deliveries.append(
                Delivery(
                    notification=notification,
                    environment_id=first.environment_id,
                    recipient_id=first.recipient_id,
                    channel=channel,
                    priority=notification.priority,
                    address=latest.address,
                    status=Delivery.Status.QUEUED,
                    reason="",
                )
            )
        Notification.objects.bulk_create(notifications, batch_size=1000)
        Delivery.objects.bulk_create(deliveries, batch_size=1000)

        deliveries_digest(
            {digest.pk: [d.pk for d in items] for digest, items in zip(deliveries, groups.values(), strict=True)},
            at=timezone.now(),
        )
        new_ids = [d.pk for d in deliveries]
        transaction.on_commit(lambda: publish_delivery_ids(new_ids))
    return len(deliveries)
