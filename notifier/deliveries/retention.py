"""The delivery log's batched purge: finished deliveries (with their events) and notifications past an age.

Used by the retention task (ops.retention) for the rows of the hot days older than RETENTION_DAYS when that is
shorter than DELIVERY_HOT_DAYS; older days are dropped whole by the partition maintenance. Each batch is its own
short transaction (core.db.limit_maintenance_transaction) that locks at most `batch` rows, skipping any a worker
holds. A delivery a dependent keeps (a pending dead letter: partitions.register_dependent) stays, and what hangs
off a purged delivery is forgotten in the same transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection, transaction

from core.db import limit_maintenance_transaction
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.partitions import forget_dependents_of_deliveries, kept_delivery_condition

FINAL_DELIVERY_STATUSES = tuple(sorted(Delivery.FINAL_STATUSES))
# A notification in one of these has nothing left to do once its deliveries are gone; scheduled ones and
# fan-outs still running are kept.
PURGEABLE_NOTIFICATION_STATUSES = (
    Notification.Status.ACCEPTED,
    Notification.Status.DONE,
    Notification.Status.CANCELLED,
)


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


def purge_batch_sql() -> str:
    """Return the SELECT of a purge batch: (ceiling, cutoff, final statuses, batch) as its parameters.

    A delivery a dependent keeps (partitions.register_dependent) is left out; the dependents' conditions are
    fixed SQL of this project's apps, never input.
    """
    kept = kept_delivery_condition()
    return (
        "SELECT d.id FROM notifier_delivery d WHERE d.id <= %s AND d.created_at < %s AND d.status = ANY(%s)"  # noqa: S608
        + (f" AND NOT ({kept})" if kept else "")
        + " ORDER BY d.id LIMIT %s FOR UPDATE OF d SKIP LOCKED"
    )


def deliveries_purge_batch(cutoff: datetime, batch: int, ceiling: int) -> tuple[int, int, int]:
    """Delete one batch of old finished deliveries with their events and what hung off them; return the counts.

    The counts: deliveries, events, and the dependents' rows forgotten (dead letters).
    """
    select = purge_batch_sql()
    with transaction.atomic():
        limit_maintenance_transaction()
        with connection.cursor() as cursor:
            cursor.execute(select, [ceiling, cutoff, list(FINAL_DELIVERY_STATUSES), batch])
            ids = [row[0] for row in cursor.fetchall()]
            if not ids:
                return 0, 0, 0
            cursor.execute("DELETE FROM notifier_deliveryevent WHERE delivery_id = ANY(%s)", [ids])
            events = cursor.rowcount
            cursor.execute("DELETE FROM notifier_delivery WHERE id = ANY(%s)", [ids])
            deliveries = cursor.rowcount
            forgotten = forget_dependents_of_deliveries(cursor, min(ids), max(ids) + 1)
    return deliveries, events, forgotten


def notifications_purge_batch(cutoff: datetime, batch: int) -> int:
    """Delete one batch of old notifications that have no delivery left; return how many."""
    notification = Notification._meta.db_table
    delivery = Delivery._meta.db_table
    with transaction.atomic():
        limit_maintenance_transaction()
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
