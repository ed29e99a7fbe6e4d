"""Background tasks of dispatch: topic fan-out and its sweep, digests (thin: call a service)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from core import task_names
from core.queues import INFRA_RETRY
from notifier.dispatch import fanout
from notifier.dispatch.digest import daily_digest_hour, digest_flush, normalise_frequency
from notifier.dispatch.fanout import PublishIncomplete, fanout_run


@shared_task(name=task_names.FANOUT_TOPIC, **INFRA_RETRY)
def fanout_topic(notification_id: str, lane: int = 0) -> dict[str, Any]:
    """Expand a bounded part of one lane of a topic notification into deliveries, then re-enqueue the rest."""
    try:
        result = fanout_run(notification_id=notification_id, lane=int(lane))
    except PublishIncomplete as exc:
        # The page's checkpoint did not move: retrying redoes it and publishes what is missing.
        raise fanout_topic.retry(exc=exc, countdown=5) from exc
    return {"pages": result.pages, "subscribers": result.subscribers, "done": result.done, "stopped": result.stopped}


@shared_task(name=task_names.FANOUT_SWEEP)
def fanout_sweep() -> int:
    """Resume fan-outs that made no progress for a while (their message was lost or never published)."""
    return fanout.fanout_sweep()


@shared_task(name=task_names.NOOP)
def noop() -> None:
    """Do nothing: the benchmarks' yardstick for the broker's empty-task rate."""
    return None


# Routed to the default "maintenance" queue, next to the other sweepers. The name is the one it had in the
# preferences app: beat rows in the database and messages in flight carry it.
@shared_task(name=task_names.FLUSH_DIGESTS, ignore_result=True)
def flush_digests(frequency: str) -> int:
    """Send the waiting hourly digests, or the daily ones of recipients whose local hour it is; return how many."""
    if normalise_frequency(frequency) == "daily_digest":
        return digest_flush(frequency=frequency, local_hour=daily_digest_hour())
    return digest_flush(frequency=frequency)
