"""Writes for recipients, devices, preferences, topics, subscriptions and the suppression list."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from preferences.models import Device, Recipient, Suppression

# What a caller may set on a recipient through recipient_upsert(); user_id and erased_at are managed here.
RECIPIENT_FIELDS = frozenset(
    {
        "email",
        "phone",
        "locale",
        "timezone",
        "webhook_url",
        "opted_out",
        "channel_prefs",
        "category_prefs",
        "quiet_start",
        "quiet_end",
    }
)


def suppression_add(*, channel: str, address: str, source: str, reason: str = "") -> Suppression:
    """Put (channel, address) on the suppression list (idempotent); a suppressed push token is deactivated."""
    suppression, _ = Suppression.objects.get_or_create(
        channel=channel, address=address, defaults={"source": source, "reason": reason[:255]}
    )
    if channel == "push":
        Device.objects.filter(token=address, active=True).update(active=False, deactivated_at=timezone.now())
    return suppression


def recipient_upsert(*, user_id: str, **fields: Any) -> tuple[Recipient, bool]:
    """Create or update the recipient `user_id` with `fields`; return it and whether it was created.

    Upserting an erased recipient brings it back (erased_at cleared) with only the data given now.
    """
    unknown = set(fields) - RECIPIENT_FIELDS
    if unknown:
        raise TypeError(f"recipient_upsert() got unknown fields: {', '.join(sorted(unknown))}")
    with transaction.atomic():
        recipient, created = Recipient.objects.select_for_update().get_or_create(user_id=user_id, defaults=fields)
        if not created:
            changed = list(fields)
            for name, value in fields.items():
                setattr(recipient, name, value)
            if recipient.erased_at is not None:
                recipient.erased_at = None
                changed.append("erased_at")
            if changed:
                recipient.save(update_fields=[*changed, "updated_at"])
    return recipient, created
