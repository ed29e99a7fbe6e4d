"""Rows for tests: one factory per model the tests build, for states the pipeline would take long to produce.

Each `make_<model>` creates one row with the ORM. Arguments not given get a fresh unique value (a new tag in
names and keys) when the model requires them and nothing otherwise, so a factory called with the fields a
test cares about makes the same row as `Model.objects.create` with those fields, and tests can make as many
rows as they like. Parents not given (client, recipient, notification, endpoint) are made too.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from channels_app.models import SandboxMessage
from notifier.clients.auth import generate_key, hash_key
from notifier.clients.models import ApiClient
from notifier.deadletters.models import DeadLetter
from notifier.deliveries import partitions
from notifier.deliveries.models import Delivery, DeliveryEvent, Notification
from notifier.dispatch.models import FanoutLane
from notifier.statusevents.models import EventAttempt, EventEndpoint, StatusEvent
from preferences.models import Device, Recipient, Subscription, Suppression, Topic
from projects.models import DEFAULT_TEST_ENVIRONMENT_ID


def _tag() -> str:
    return uuid.uuid4().hex[:12]


def make_api_client(**fields: Any) -> ApiClient:
    """Create an API client with a real key; the raw key is on the row as `raw_key` (for a Bearer header)."""
    raw, prefix = generate_key()
    fields.setdefault("name", f"svc-{_tag()}")
    fields.setdefault("key_prefix", prefix)
    fields.setdefault("key_hash", hash_key(raw))
    # A test client belongs to the default project's test environment, as api_client_create puts it.
    if fields.get("mode") == ApiClient.Mode.TEST and "environment" not in fields and "environment_id" not in fields:
        fields["environment_id"] = DEFAULT_TEST_ENVIRONMENT_ID
    client = ApiClient.objects.create(**fields)
    client.raw_key = raw  # type: ignore[attr-defined]
    return client


def make_recipient(**fields: Any) -> Recipient:
    """Create a recipient (user id `u-<tag>` unless given)."""
    fields.setdefault("user_id", f"u-{_tag()}")
    return Recipient.objects.create(**fields)


def make_notification(
    *,
    client: ApiClient | None = None,
    category: str = "transactional",
    template_key: str = "order_shipped",
    priority: str = "high",
    **fields: Any,
) -> Notification:
    """Create a notification of `client` (a new one unless given)."""
    return Notification.objects.create(
        client=client or make_api_client(), category=category, template_key=template_key, priority=priority, **fields
    )


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
    """Create a delivery, and whichever of its client, recipient and notification are not given.

    Any other Delivery field (provider, provider_message_id, content, ...) passes through `fields`.
    """
    tag = _tag()
    if recipient is None:
        recipient = make_recipient(user_id=f"u-{tag}", email=address or f"{tag}@example.com")
    if notification is None:
        notification = make_notification(
            client=client or make_api_client(name=f"svc-{tag}"),
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

    Rows live in the partition of the day their id carries (notifier/deliveries/partitions.py), so backdating a row
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


def make_delivery_event(*, delivery: Delivery, status: str, **fields: Any) -> DeliveryEvent:
    """Record a status event of `delivery` (now unless `at` is given)."""
    fields.setdefault("at", timezone.now())
    return DeliveryEvent.objects.create(delivery=delivery, status=status, **fields)


def make_dead_letter(*, delivery: Delivery, reason: str = "exhausted", **fields: Any) -> DeadLetter:
    """Dead-letter `delivery` (its channel and high-priority queue unless given)."""
    fields.setdefault("channel", delivery.channel)
    fields.setdefault("queue", f"{fields['channel']}.high")
    return DeadLetter.objects.create(delivery=delivery, reason=reason, **fields)


def make_fanout_lane(*, notification: Notification, lane: int, **fields: Any) -> FanoutLane:
    """Create one id range (lane) of a topic notification's fan-out."""
    return FanoutLane.objects.create(notification=notification, lane=lane, **fields)


def make_sandbox_message(**fields: Any) -> SandboxMessage:
    """Record what a sandbox provider "sent"."""
    return SandboxMessage.objects.create(**fields)


def make_topic(**fields: Any) -> Topic:
    """Create a topic (key `t-<tag>` unless given)."""
    fields.setdefault("key", f"t-{_tag()}")
    return Topic.objects.create(**fields)


def make_subscription(*, topic: Topic, recipient: Recipient, **fields: Any) -> Subscription:
    """Subscribe `recipient` to `topic`."""
    return Subscription.objects.create(topic=topic, recipient=recipient, **fields)


def make_device(*, recipient: Recipient, **fields: Any) -> Device:
    """Register a push device of `recipient` (token `tok-<tag>` unless given)."""
    fields.setdefault("token", f"tok-{_tag()}")
    return Device.objects.create(recipient=recipient, **fields)


def make_suppression(*, channel: str = "email", **fields: Any) -> Suppression:
    """Suppress an address on `channel` (a fresh email address unless given)."""
    fields.setdefault("address", f"{_tag()}@example.com")
    return Suppression.objects.create(channel=channel, **fields)


def make_event_endpoint(**fields: Any) -> EventEndpoint:
    """Create a status-event endpoint of a client (a new one unless given)."""
    fields.setdefault("client", make_api_client())
    fields.setdefault("url", "https://events.example.com/hook")
    fields.setdefault("secret", "whsec_eA==")
    return EventEndpoint.objects.create(**fields)


def make_status_event(*, endpoint: EventEndpoint, **fields: Any) -> StatusEvent:
    """Create a status event queued for `endpoint`."""
    return StatusEvent.objects.create(endpoint=endpoint, **fields)


def make_event_attempt(*, endpoint: EventEndpoint, **fields: Any) -> EventAttempt:
    """Record one delivery attempt of status events to `endpoint`."""
    return EventAttempt.objects.create(endpoint=endpoint, **fields)


def make_staff_user(username: str, *, password: str = "pw-123456", superuser: bool = False, **fields: Any) -> User:
    """Create a staff user (a superuser if asked) that can log in with `password`."""
    if superuser:
        return User.objects.create_superuser(username, fields.pop("email", f"{username}@example.com"), password)
    return User.objects.create_user(username, password=password, is_staff=True, **fields)
