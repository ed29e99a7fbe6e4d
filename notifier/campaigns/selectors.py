"""Reads of campaigns: one campaign with its runs and delivery progress, a client's campaigns."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import Count

from notifier.campaigns.models import Campaign
from notifier.clients.models import ApiClient
from notifier.deliveries.models import Delivery, Notification

SENT = ("sent", "delivered", "opened")
FAILED = ("failed", "bounced")
PENDING = ("queued", "sending", "deferred", "scheduled")


def campaign_get(*, client: ApiClient, campaign_id: int) -> Campaign | None:
    """Return the client's campaign, or None."""
    return Campaign.objects.filter(client=client, pk=campaign_id).select_related("topic", "periodic_task").first()


def campaign_list(*, client: ApiClient, limit: int = 100) -> list[Campaign]:
    """Return the client's most recent campaigns."""
    return list(Campaign.objects.filter(client=client).select_related("topic").order_by("-id")[:limit])


def campaign_progress(*, campaign: Campaign) -> dict[str, Any]:
    """Count the deliveries of every run of a campaign: targeted, sent, failed, suppressed, pending, cancelled."""
    rows = Delivery.objects.filter(notification__campaign=campaign).values("status").annotate(n=Count("id")).order_by()
    by_status = {row["status"]: row["n"] for row in rows}
    return {
        "targeted": sum(by_status.values()),
        "sent": sum(by_status.get(s, 0) for s in SENT),
        "failed": sum(by_status.get(s, 0) for s in FAILED),
        "suppressed": by_status.get("suppressed", 0),
        "pending": sum(by_status.get(s, 0) for s in PENDING),
        "cancelled": by_status.get("cancelled", 0),
        "by_status": by_status,
    }


def campaign_runs(*, campaign: Campaign, limit: int = 50) -> list[Notification]:
    """Return the notifications a campaign's runs created, newest first."""
    return list(
        Notification.objects.filter(campaign=campaign)
        .only("id", "status", "created_at", "fanout_processed", "recipients_total", "campaign_id")
        .order_by("-created_at")[:limit]
    )


def attach_campaigns(notifications: Sequence[Notification]) -> None:
    """Set each notification's campaign (as select_related would) with one query for all of them."""
    ids = {n.campaign_id for n in notifications if n.campaign_id is not None}
    found = Campaign.objects.in_bulk(ids) if ids else {}
    for n in notifications:
        n._state.fields_cache["campaign"] = found.get(n.campaign_id) if n.campaign_id is not None else None
