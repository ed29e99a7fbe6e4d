"""The campaign task beat fires (thin: call the service)."""

from __future__ import annotations

from celery import shared_task

from core import task_names
from core.queues import INFRA_RETRY
from notifier.campaigns.services import campaign_run


@shared_task(name=task_names.RUN_CAMPAIGN, **INFRA_RETRY)
def run_campaign(campaign_id: int) -> str | None:
    """Start one run of a campaign (called by beat; runs once even if two beat processes fire it)."""
    notification = campaign_run(campaign_id=int(campaign_id))
    return str(notification.pk) if notification is not None else None
