"""Retention: delete finished deliveries, their events and what hangs off them, in small batches.

The batches are their owners': notifier.deliveries.retention (deliveries, notifications), channels_app.sandbox
(sandbox records), notifier.statusevents.services (status events and attempts); this module runs them in turn.

Each batch is its own short transaction that locks at most `batch` delivery rows (skipping any a worker
holds right now), so the purge never takes one long lock on the hot tables and can run at any hour next to
the live traffic. A run stops after RETENTION_MAX_SECONDS and the next run continues: together with
late acks this also keeps one run well under RabbitMQ's consumer timeout.

Only deliveries in a final status are removed; anything still waiting (scheduled far ahead, deferred,
queued, sending) and anything with a dead letter still pending for an operator is kept whatever its age.
Notifications older than the cutoff that have no delivery left go too (this frees their dedup_key), and so
do sandbox records, which hold rendered messages and addresses, and status events already sent to (or given up
for) calling services, with their attempt records.

Since the hot tables are partitioned by day (notifier/deliveries/partitions.py), their days past
DELIVERY_HOT_DAYS are dropped whole by `partitions.maintain`, not deleted here; this purge bounds the tables
that are not partitioned, and the hot days' finished rows when RETENTION_DAYS is the shorter.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import IntegrityError
from django.utils import timezone

from channels_app.sandbox import sandbox_purge_batch
from core import metrics, task_names
from notifier.deliveries.retention import deliveries_purge_batch, delivery_id_ceiling, notifications_purge_batch
from notifier.statusevents.services import status_events_purge_batch

logger = logging.getLogger(__name__)


def retention_purge(*, older_than_days: int, batch: int = 5000, max_seconds: float | None = None) -> dict[str, Any]:
    """Delete finished deliveries (with events and dead letters) older than `older_than_days`, in batches.

    Returns the counts per table, the number of batches, the cutoff and whether the run finished (False
    when `max_seconds` ran out first; the next run continues).
    """
    if older_than_days < 1:
        raise ValueError("older_than_days must be at least 1")
    if batch < 1:
        raise ValueError("batch must be positive")
    cutoff = timezone.now() - timedelta(days=older_than_days)
    deadline = time.monotonic() + max_seconds if max_seconds else None
    totals = {"deliveries": 0, "events": 0, "dead_letters": 0, "notifications": 0, "sandbox_messages": 0}
    totals["status_events"] = 0
    batches = 0
    finished = True
    ceiling = delivery_id_ceiling(cutoff)

    def out_of_time() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    for step in ("deliveries", "notifications", "sandbox_messages", "status_events"):
        while True:
            if out_of_time():
                finished = False
                break
            if step == "deliveries":
                if ceiling is None:
                    break
                deliveries, events, dead_letters = deliveries_purge_batch(cutoff, batch, ceiling)
                totals["deliveries"] += deliveries
                totals["events"] += events
                totals["dead_letters"] += dead_letters
                done = deliveries
            elif step == "notifications":
                try:
                    done = notifications_purge_batch(cutoff, batch)
                except IntegrityError:
                    # Something new points at old notifications: keep them rather than fail the whole purge.
                    logger.warning("retention skipped notifications still referenced")
                    done = 0
                totals["notifications"] += done
            elif step == "sandbox_messages":
                done = sandbox_purge_batch(cutoff, batch)
                totals["sandbox_messages"] += done
            else:
                done = status_events_purge_batch(cutoff, batch)
                totals["status_events"] += done
            if done:
                batches += 1
            # A short batch means nothing older is left (rows locked by a worker are picked up next run).
            if done < batch:
                break
        if not finished:
            break

    for table, n in totals.items():
        metrics.count_retention_deleted(table, n)
    result: dict[str, Any] = {**totals, "batches": batches, "cutoff": cutoff.isoformat(), "finished": finished}
    logger.info("retention purge", extra=result)
    return result


@shared_task(name=task_names.RETENTION_PURGE, ignore_result=True)
def purge_old_deliveries(older_than_days: int | None = None) -> dict[str, Any] | None:
    """Run the retention purge with the configured age, batch size and time budget (a beat schedule)."""
    days = settings.RETENTION_DAYS if older_than_days is None else older_than_days
    if days <= 0:
        return None
    return retention_purge(
        older_than_days=days, batch=settings.RETENTION_BATCH, max_seconds=settings.RETENTION_MAX_SECONDS
    )
