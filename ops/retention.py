"""Retention: delete finished deliveries, their events and what hangs off them, in small batches.

Each batch is its own short transaction that locks at most `batch` delivery rows (skipping any a worker
holds right now), so the purge never takes one long lock on the hot tables and can run at any hour next to
the live traffic. A run stops after RETENTION_MAX_SECONDS and the next run continues: together with
late acks this also keeps one run well under RabbitMQ's consumer timeout.

Only deliveries in a final status are removed; anything still waiting (scheduled far ahead, deferred,
queued, sending) and anything with a dead letter still pending for an operator is kept whatever its age.
Notifications older than the cutoff that have no delivery left go too (this frees their dedup_key), and so
do sandbox records, which hold rendered messages and addresses, and status events already sent to (or given up
for) calling services, with their attempt records.

Since the hot tables are partitioned by day (notifier/partitions.py), their days past DELIVERY_HOT_DAYS are
dropped whole by `partitions.maintain`, not deleted here; this purge still drains the `<table>_legacy`
partitions (rows from before the migration) and the tables that are not partitioned.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from channels_app.models import SandboxMessage
from core import metrics
from notifier.models import DeadLetter, Delivery, DeliveryEvent, Notification

logger = logging.getLogger(__name__)

FINAL_DELIVERY_STATUSES = tuple(sorted(Delivery.FINAL_STATUSES))
# A notification in one of these has nothing left to do once its deliveries are gone; scheduled ones and
# fan-outs still running are kept.
PURGEABLE_NOTIFICATION_STATUSES = (
    Notification.Status.ACCEPTED,
    Notification.Status.DONE,
    Notification.Status.CANCELLED,
)
# Per-statement guards: a batch that cannot get its locks quickly gives up instead of queueing behind (and
# in front of) the live traffic; the next run picks the rows up.
LOCK_TIMEOUT = "5s"
STATEMENT_TIMEOUT = "60s"


def _short_transaction_settings() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(f"SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'")


def delivery_id_ceiling(cutoff: datetime) -> int | None:
    """Return the highest delivery id created before `cutoff` (None if there is none).

    Ids grow with created_at (both are set at insert), so a binary search over the primary key finds the
    boundary with a few dozen single-row index probes. The batches then walk the primary key only up to
    this id: neither the search nor the last, short batch of a run ever scans the recent part of the table.
    Clock skew between app servers only shifts the boundary by seconds; the created_at filter in every
    batch keeps the purge exact, and a row just past the boundary is taken by the next run.
    """
    table = Delivery._meta.db_table
    with connection.cursor() as cursor:

        def first_at_or_after(delivery_id: int) -> tuple[int, Any] | None:
            cursor.execute(
                f"SELECT id, created_at FROM {table} WHERE id >= %s ORDER BY id LIMIT 1",  # noqa: S608
                [delivery_id],
            )
            row = cursor.fetchone()
            return (int(row[0]), row[1]) if row else None

        first = first_at_or_after(0)
        if first is None or first[1] >= cutoff:
            return None
        cursor.execute(f"SELECT max(id) FROM {table}")  # noqa: S608
        low, high = first[0], int(cursor.fetchone()[0])
        while low < high:
            middle = (low + high + 1) // 2
            row = first_at_or_after(middle)
            if row is None or row[1] >= cutoff:
                high = middle - 1
            else:
                low = row[0]
        return low


def _purge_delivery_batch(cutoff: datetime, batch: int, ceiling: int) -> tuple[int, int, int]:
    """Delete one batch of old finished deliveries with their events and dead letters; return the counts."""
    delivery = Delivery._meta.db_table
    event = DeliveryEvent._meta.db_table
    dead = DeadLetter._meta.db_table
    with transaction.atomic():
        _short_transaction_settings()
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                SELECT d.id FROM {delivery} d
                WHERE d.id <= %s AND d.created_at < %s AND d.status = ANY(%s)
                  AND NOT EXISTS (
                      SELECT 1 FROM {dead} dl WHERE dl.delivery_id = d.id AND dl.status = %s
                  )
                ORDER BY d.id
                LIMIT %s
                FOR UPDATE OF d SKIP LOCKED
                """,  # noqa: S608 - table names come from model metadata, values are parameters
                [ceiling, cutoff, list(FINAL_DELIVERY_STATUSES), DeadLetter.Status.PENDING, batch],
            )
            ids = [row[0] for row in cursor.fetchall()]
            if not ids:
                return 0, 0, 0
            cursor.execute(f"DELETE FROM {event} WHERE delivery_id = ANY(%s)", [ids])  # noqa: S608
            events = cursor.rowcount
            cursor.execute(f"DELETE FROM {dead} WHERE delivery_id = ANY(%s)", [ids])  # noqa: S608
            dead_letters = cursor.rowcount
            cursor.execute(f"DELETE FROM {delivery} WHERE id = ANY(%s)", [ids])  # noqa: S608
            deliveries = cursor.rowcount
    return deliveries, events, dead_letters


def _purge_notification_batch(cutoff: datetime, batch: int) -> int:
    """Delete one batch of old notifications that have no delivery left; return how many."""
    notification = Notification._meta.db_table
    delivery = Delivery._meta.db_table
    with transaction.atomic():
        _short_transaction_settings()
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                DELETE FROM {notification} WHERE id IN (
                    SELECT n.id FROM {notification} n
                    WHERE n.created_at < %s AND n.status = ANY(%s)
                      AND NOT EXISTS (SELECT 1 FROM {delivery} d WHERE d.notification_id = n.id)
                    LIMIT %s
                    FOR UPDATE OF n SKIP LOCKED
                )
                """,  # noqa: S608
                [cutoff, list(PURGEABLE_NOTIFICATION_STATUSES), batch],
            )
            return cursor.rowcount


def _purge_sandbox_batch(cutoff: datetime, batch: int) -> int:
    """Delete one batch of sandbox records older than the cutoff; return how many."""
    table = SandboxMessage._meta.db_table
    with transaction.atomic():
        _short_transaction_settings()
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE created_at < %s ORDER BY id LIMIT %s)",  # noqa: S608
                [cutoff, batch],
            )
            return cursor.rowcount


def _purge_status_event_batch(cutoff: datetime, batch: int) -> int:
    """Delete one batch of sent or given-up status events, and of event attempts, older than the cutoff."""
    done = 0
    with transaction.atomic():
        _short_transaction_settings()
        with connection.cursor() as cursor:
            # Pending events stay whatever their age: the sender gives them up (with a record) after its window.
            cursor.execute(
                "DELETE FROM notifier_statusevent WHERE id IN (SELECT id FROM notifier_statusevent"
                " WHERE at < %s AND state <> 'pending' ORDER BY id LIMIT %s)",
                [cutoff, batch],
            )
            done += cursor.rowcount
            cursor.execute(
                "DELETE FROM notifier_eventattempt WHERE id IN (SELECT id FROM notifier_eventattempt"
                " WHERE at < %s ORDER BY id LIMIT %s)",
                [cutoff, batch],
            )
            done = max(done, cursor.rowcount)
    return done


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
                deliveries, events, dead_letters = _purge_delivery_batch(cutoff, batch, ceiling)
                totals["deliveries"] += deliveries
                totals["events"] += events
                totals["dead_letters"] += dead_letters
                done = deliveries
            elif step == "notifications":
                try:
                    done = _purge_notification_batch(cutoff, batch)
                except IntegrityError:
                    # Something new points at old notifications: keep them rather than fail the whole purge.
                    logger.warning("retention skipped notifications still referenced")
                    done = 0
                totals["notifications"] += done
            elif step == "sandbox_messages":
                done = _purge_sandbox_batch(cutoff, batch)
                totals["sandbox_messages"] += done
            else:
                done = _purge_status_event_batch(cutoff, batch)
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


@shared_task(name="notifier.retention.purge_old_deliveries", ignore_result=True)
def purge_old_deliveries(older_than_days: int | None = None) -> dict[str, Any] | None:
    """Run the retention purge with the configured age, batch size and time budget (a beat schedule)."""
    days = settings.RETENTION_DAYS if older_than_days is None else older_than_days
    if days <= 0:
        return None
    return retention_purge(
        older_than_days=days, batch=settings.RETENTION_BATCH, max_seconds=settings.RETENTION_MAX_SECONDS
    )
