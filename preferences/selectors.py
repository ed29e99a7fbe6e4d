"""Reads for recipients, preferences, topics and the suppression list."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.db.models import QuerySet

from core.db import RowLoader, bound_cursor
from preferences.models import CHANNEL_ADDRESS_USER_ID, Recipient, Subscription, Suppression, Topic
from projects.scoping import owner_default, scope_environment_id

_RECIPIENT = RowLoader(Recipient)
_RECIPIENTS_BY_USER_ID = (
    f"SELECT {_RECIPIENT.columns('r')} FROM preferences_recipient r"  # noqa: S608
    " WHERE r.environment_id = %s AND r.user_id = ANY(%s::text[])"
)


def recipient_get(*, user_id: str, include_erased: bool = False) -> Recipient | None:
    """Return the recipient `user_id` of the scope's environment, or None if unknown (or erased, unless asked)."""
    # Every project environment may have a recipient `user_id`: found only within one (an API key's, a link's).
    qs = Recipient.objects.filter(environment_id=scope_environment_id(), user_id=user_id)
    if not include_erased:
        qs = qs.filter(erased_at__isnull=True)
    return qs.first()


def recipient_environment_id(*, recipient_id: int) -> int | None:
    """Return the environment that owns the recipient with this id, or None if there is no such recipient."""
    return Recipient.objects.filter(pk=recipient_id).values_list("environment_id", flat=True).first()


def recipient_for_send(*, user_id: str) -> Recipient | None:
    """Return the recipient `user_id` as it is, erased ones too, or None: one raw query, an accept's hottest read.

    The same instance the ORM would build (through core.db.RowLoader); compiling the queryset had cost more
    than running it.
    """
    return recipients_for_send(user_ids=[user_id]).get(user_id)


def recipients_for_send(*, user_ids: Collection[str], environment_id: int | None = None) -> dict[str, Recipient]:
    """Return the recipients among `user_ids` by user id, as recipient_for_send does for one (erased ones too).

    Of `environment_id`, else of the scope's owner (projects.scoping).
    """
    if not user_ids:
        return {}
    with bound_cursor() as cursor:
        cursor.execute(_RECIPIENTS_BY_USER_ID, [environment_id or owner_default(), list(user_ids)])
        rows = cursor.fetchall()
    found = [_RECIPIENT.build(row) for row in rows]
    return {r.user_id: r for r in found}


def recipient_preferences(*, recipient: Recipient) -> dict[str, Any]:
    """Return a recipient's preferences in the API's shape."""
    quiet: dict[str, str] | None = None
    if recipient.quiet_start is not None and recipient.quiet_end is not None:
        quiet = {"start": recipient.quiet_start.strftime("%H:%M"), "end": recipient.quiet_end.strftime("%H:%M")}
    return {
        "opted_out": recipient.opted_out,
        "channels": dict(recipient.channel_prefs or {}),
        "categories": dict(recipient.category_prefs or {}),
        "quiet_hours": quiet,
    }


def recipient_device_tokens(*, recipient: Recipient) -> list[dict[str, Any]]:
    """Return a recipient's active devices (platform and token)."""
    return [dict(row) for row in recipient.devices.filter(active=True).order_by("id").values("platform", "token")]


def recipient_list(
    *, email: str | None = None, phone: str | None = None, after_id: int = 0, limit: int = 50
) -> list[Recipient]:
    """Return up to `limit` recipients (erased ones left out) with id > `after_id` in id order (keyset page).

    `email` and `phone` match exactly, as stored (the caller normalises them as the recipient's own fields are);
    recipient_email_idx and recipient_phone_idx serve them.
    """
    qs: QuerySet[Recipient] = Recipient.objects.filter(pk__gt=after_id, erased_at__isnull=True).exclude(
        user_id=CHANNEL_ADDRESS_USER_ID
    )
    if email:
        qs = qs.filter(email=email)
    if phone:
        qs = qs.filter(phone=phone)
    return list(qs.order_by("pk")[:limit])


def topic_list(*, after_id: int = 0, limit: int = 50) -> list[Topic]:
    """Return up to `limit` topics with id > `after_id` in id order (keyset page)."""
    return list(Topic.objects.filter(pk__gt=after_id).order_by("pk")[:limit])


def topic_get(*, key: str) -> Topic | None:
    """Return the topic `key`, or None."""
    return Topic.objects.filter(key=key).first()


def topic_subscriber_count(*, topic: Topic) -> int:
    """Return how many recipients subscribe to a topic."""
    return Subscription.objects.filter(topic=topic).count()


def suppression_list(
    *, channel: str | None = None, address: str | None = None, after_id: int = 0, limit: int = 100
) -> list[Suppression]:
    """Return up to `limit` suppressions with id > `after_id` in id order, optionally filtered (keyset page)."""
    qs: QuerySet[Suppression] = Suppression.objects.filter(pk__gt=after_id)
    if channel:
        qs = qs.filter(channel=channel)
    if address:
        qs = qs.filter(address=address)
    return list(qs.order_by("pk")[:limit])


def suppression_get(*, suppression_id: int, own_only: bool = False) -> Suppression | None:
    """Return one suppression-list entry, or None; `own_only`: not an installation-wide one (read-only to keys)."""
    found = Suppression.objects.filter(pk=suppression_id)
    if own_only:
        found = found.filter(environment__isnull=False)
    return found.first()


def suppression_exists(*, channel: str, address: str, own_only: bool = False) -> bool:
    """Return whether (channel, address) is on the suppression list (`own_only`: the scope's own list only)."""
    found = Suppression.objects.filter(channel=channel, address=address)
    if own_only:
        found = found.filter(environment__isnull=False)
    return found.exists()
