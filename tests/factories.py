"""Rows for tests that need a delivery in a given state without running the pipeline that produces it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from django.db import connection

from notifier import partitions
from notifier.models import ApiClient, Delivery, Notification
from preferences.models import Recipient


def make_delivery(
    *,
    channel: str = "email",
    status: str = Delivery.Status.SENT,
    address: str | None = None,
    client: ApiClient | None = None,
    recipient: Recipient | None = None,
    notification: Notification | None = None,
    category: str = "transactional",
    template_key: str = "order_shipped",
    priority: str = "high",
    **fields: Any,
) -> Delivery:
    """Create a delivery with the ORM, and whichever of its client, recipient and notification are not given.

    Every made row is unique (a fresh tag in its names), so tests can make as many as they like. Any other
    Delivery field (provider, provider_message_id, content, ...) passes through `fields`.
    """
    tag = uuid.uuid4().hex[:12]
    if recipient is None:
        recipient = Recipient.objects.create(user_id=f"u-{tag}", email=address or f"{tag}@example.com")
    if notification is None:
        if client is None:
            client = ApiClient.objects.create(name=f"svc-{tag}", key_prefix=tag[:8], key_hash=uuid.uuid4().hex * 2)
        notification = Notification.objects.create(
            client=client,
            category=category,
            template_key=template_key,
            channels=[channel],
            priority=priority,
            recipient=recipient,
            user_id=recipient.user_id,
        )
    if address is None:
        address = recipient.user_id if channel == "inapp" else recipient.email or f"{tag}@example.com"
    return Delivery.objects.create(
        notification=notification,
        recipient=recipient,
        channel=channel,
        priority=priority,
        address=address,
        status=status,
        **fields,
    )


def move_to_day(delivery: Delivery, when: datetime) -> Delivery:
    """Move a delivery, its notification and its events to `when`, ids included, and return it reloaded.

    Rows live in the partition of the day their id carries (notifier/partitions.py), so backdating a row
    means giving it that day's ids, not only a new created_at; the day's partitions are made if missing.
    """
    for table in (partitions.NOTIFICATION, partitions.DELIVERY, partitions.EVENT):
        partitions.create_partition(table, when.astimezone(UTC).date())
    notification_id = partitions.uuid7(when)
    with connection.cursor() as cursor:
        cursor.execute("SELECT notifier_delivery_id(%s)", [when])
        delivery_id = cursor.fetchone()[0]
        cursor.execute(
            "UPDATE notifier_notification SET id = %s, created_at = %s WHERE id = %s",
            [notification_id, when, delivery.notification_id],
        )
        cursor.execute(
            "UPDATE notifier_delivery SET id = %s, notification_id = %s, created_at = %s WHERE id = %s",
            [delivery_id, notification_id, when, delivery.pk],
        )
        cursor.execute(
            "UPDATE notifier_deliveryevent SET delivery_id = %s WHERE delivery_id = %s", [delivery_id, delivery.pk]
        )
    return Delivery.objects.get(pk=delivery_id)
