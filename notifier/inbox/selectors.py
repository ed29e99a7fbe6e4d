"""Reads of the in-app inbox."""

from __future__ import annotations

from django.db.models import QuerySet

from notifier.deliveries.models import Delivery
from notifier.deliveries.partitions import notification_range_of_delivery
from notifier.tracking.services import is_web_url
from preferences.models import Recipient
from projects.scoping import scope_environment_id

INBOX_CHANNEL = "inapp"
# An in-app delivery shows once the worker has stored it (`sent`); reading it moves it to `opened`.
INBOX_VISIBLE_STATUSES = (Delivery.Status.SENT, Delivery.Status.DELIVERED, Delivery.Status.OPENED)
READABLE_STATUSES = (Delivery.Status.SENT, Delivery.Status.DELIVERED)


def inbox_recipient_get(*, user_id: str) -> Recipient | None:
    """Return the recipient of the scope's environment whose inbox this is, or None if unknown or erased."""
    # Every project environment may have a recipient `user_id`: found only within one (an API key's, a token's).
    return Recipient.objects.filter(
        environment_id=scope_environment_id(), user_id=user_id, erased_at__isnull=True
    ).first()


def inbox_queryset(*, recipient: Recipient) -> QuerySet[Delivery]:
    """Return the recipient's visible inbox deliveries (served by the partial index delivery_inbox_idx)."""
    return Delivery.objects.filter(recipient=recipient, channel=INBOX_CHANNEL, status__in=INBOX_VISIBLE_STATUSES)


def inbox_list(
    *,
    recipient: Recipient,
    unread_only: bool = False,
    archived: bool = False,
    before_id: int | None = None,
    limit: int = 20,
) -> tuple[list[Delivery], int | None]:
    """Return one page of the inbox, newest first, and the id to continue before (None on the last page).

    Archived items are left out, unless `archived`, which lists only them.
    """
    qs = inbox_queryset(recipient=recipient).filter(archived_at__isnull=not archived)
    if unread_only:
        qs = qs.filter(read_at__isnull=True)
    if before_id is not None:
        qs = qs.filter(pk__lt=before_id)
    rows = list(
        qs.select_related("notification")
        .only(
            "id",
            "content",
            "created_at",
            "read_at",
            "archived_at",
            "status",
            "notification__id",
            "notification__category",
        )
        .order_by("-id")[: limit + 1]
    )
    if len(rows) > limit:
        return rows[:limit], rows[limit - 1].pk
    return rows, None


def inbox_unread_count(*, recipient: Recipient) -> int:
    """Return how many visible inbox items the recipient has not read."""
    return inbox_queryset(recipient=recipient).filter(read_at__isnull=True).count()


def inbox_item_url(item: Delivery) -> str:
    """Return an inbox item's action URL (the template's rendered `inapp.url`) if it is http(s), else ""."""
    url = str((item.content or {}).get("url", "")).strip()
    return url if is_web_url(url) else ""


def inbox_item_get(*, recipient: Recipient, delivery_id: int) -> Delivery | None:
    """Return one visible inbox item of the recipient, or None."""
    found = inbox_queryset(recipient=recipient).select_related("notification").filter(pk=delivery_id)
    # The notification joined from its day's partition only: the delivery id says which
    # (notifier/deliveries/partitions.py).
    bounds = notification_range_of_delivery(delivery_id)
    item = found.filter(notification__created_at__range=bounds).first() if bounds is not None else None
    return item or found.first()
