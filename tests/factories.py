"""Rows for tests that need a delivery in a given state without running the pipeline that produces it."""

from __future__ import annotations

import uuid
from typing import Any

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
