"""The sandbox's records: kept for the test keys' reads, purged in batches past RETENTION_DAYS."""

from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction

from channels_app.models import SandboxMessage
from core.db import limit_maintenance_transaction


def sandbox_purge_batch(cutoff: datetime, batch: int) -> int:
    """Delete one batch of sandbox records older than the cutoff; return how many."""
    table = SandboxMessage._meta.db_table
    with transaction.atomic():
        limit_maintenance_transaction()
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE created_at < %s ORDER BY id LIMIT %s)",  # noqa: S608
                [cutoff, batch],
            )
            return int(cursor.rowcount)
