"""Periodic and background tasks: outbox relay, fan-out, campaigns, digests (thin: load by id, call a service)."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import InterfaceError, OperationalError

from core.queues import OwnQueueTask
from notifier import fanout, strategy
from notifier.campaigns.services import campaign_run
from notifier.digest import daily_digest_hour, digest_flush, normalise_frequency
from notifier.fanout import PublishIncomplete, fanout_run
from notifier.outbox import relay
from notifier.strategy import fallback_decide

# Infrastructure errors (the database went away, the broker refused a page's messages) retry with backoff; the
# checkpoint makes a retried fan-out run resume where it stopped. Each retry names the queue its message came
# from (OwnQueueTask): routed by the delayed message's own routing key, a second retry was lost.
_RETRY: dict[str, Any] = {
    "base": OwnQueueTask,
    "autoretry_for": (OperationalError, InterfaceError),
    "retry_backoff": 2,
    "retry_backoff_max": 60,
    "retry_jitter": True,
    "max_retries": 10,
}


@shared_task(name="notifier.tasks.outbox_relay")
def outbox_relay() -> dict[str, int]:
    """Publish deliveries the fast path missed and wake those now due."""
    return relay()


@shared_task(name="notifier.tasks.fanout_topic", **_RETRY)
def fanout_topic(notification_id: str, lane: int = 0) -> dict[str, Any]:
    """Expand a bounded part of one lane of a topic notification into deliveries, then re-enqueue the rest."""
    try:
        result = fanout_run(notification_id=notification_id, lane=int(lane))
    except PublishIncomplete as exc:
        # The page's checkpoint did not move: retrying redoes it and publishes what is missing.
        raise fanout_topic.retry(exc=exc, countdown=5) from exc
    return {"pages": result.pages, "subscribers": result.subscribers, "done": result.done, "stopped": result.stopped}


@shared_task(name="notifier.tasks.fanout_sweep")
def fanout_sweep() -> int:
    """Resume fan-outs that made no progress for a while (their message was lost or never published)."""
    return fanout.fanout_sweep()


@shared_task(name="notifier.tasks.fallback_due", **_RETRY)
def fallback_due(delivery_ids: list[int]) -> dict[str, int]:
    """Decide the fallback chains of these pending deliveries now that their deadline has come."""
    decisions = fallback_decide(delivery_ids=[int(i) for i in delivery_ids])
    return {"started": len(decisions.started), "skipped": len(decisions.skipped)}


@shared_task(name="notifier.tasks.fallback_sweep")
def fallback_sweep() -> int:
    """Decide fallback chains whose deadline passed without a decision (a lost or long timer)."""
    return strategy.fallback_sweep()


@shared_task(name="notifier.tasks.run_campaign", **_RETRY)
def run_campaign(campaign_id: int) -> str | None:
    """Start one run of a campaign (called by beat; runs once even if two beat processes fire it)."""
    notification = campaign_run(campaign_id=int(campaign_id))
    return str(notification.pk) if notification is not None else None


@shared_task(name="notifier.tasks.noop")
def noop() -> None:
    """Do nothing: the benchmarks' yardstick for the broker's empty-task rate."""
    return None


# Routed to the default "maintenance" queue, next to the other sweepers. The name is the one it had in the
# preferences app: beat rows in the database and messages in flight carry it.
@shared_task(name="preferences.tasks.flush_digests", ignore_result=True)
def flush_digests(frequency: str) -> int:
    """Send the waiting hourly digests, or the daily ones of recipients whose local hour it is; return how many."""
    if normalise_frequency(frequency) == "daily_digest":
        return digest_flush(frequency=frequency, local_hour=daily_digest_hour())
    return digest_flush(frequency=frequency)
