"""Partition notifications, deliveries and their events by day; dedup keys get a table of their own.

A migration of its own: the indexes of 0001's foreign keys are created when that migration ends, so the
tables can be replaced by partitioned parents only after it.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

import notifier.deliveries.partitions

DEDUP_TABLE = """
CREATE TABLE notifier_dedupkey (
    client_id bigint NOT NULL,
    dedup_key varchar(255) NOT NULL,
    notification_id uuid NOT NULL,
    request_hash varchar(64) NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    PRIMARY KEY (client_id, dedup_key)
);
CREATE INDEX dedupkey_created_idx ON notifier_dedupkey (created_at);
"""


def partition(apps: Any, schema_editor: Any) -> None:
    """Make the three hot tables partitioned by day, with today's partitions and the days ahead."""
    with schema_editor.connection.cursor() as cursor:
        notifier.deliveries.partitions.partition_new_tables(cursor)


class Migration(migrations.Migration):
    dependencies = [("deliveries", "0001_initial")]

    operations = [
        # The unique (client, dedup_key) of a notification lives in a table of its own: a partition's unique
        # index would see one day only.
        migrations.RunSQL(DEDUP_TABLE, reverse_sql="DROP TABLE notifier_dedupkey"),
        migrations.RunPython(partition, migrations.RunPython.noop),
    ]
