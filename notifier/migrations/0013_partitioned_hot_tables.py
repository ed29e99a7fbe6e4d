"""Partition notifications, deliveries and delivery events by day; dedup keys get a table of their own.

Online (docs/operations.md, "Partitioned hot tables"): the scans run before any blocking lock (a validated
CHECK bounds each table's rows, the new primary-key index is built concurrently), then one short
transaction renames each table to `<table>_legacy`, puts a partitioned parent in its place and attaches
the old table as the partition of every key below the cut-over. No row is copied.
"""

from __future__ import annotations

from typing import Any

import django.db.models.deletion
from django.db import migrations, models, transaction

import notifier.models
import notifier.partitions

DEDUP_TABLE = """
CREATE TABLE IF NOT EXISTS notifier_dedupkey (
    client_id bigint NOT NULL,
    dedup_key varchar(255) NOT NULL,
    notification_id uuid NOT NULL,
    request_hash varchar(64) NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    PRIMARY KEY (client_id, dedup_key)
);
CREATE INDEX IF NOT EXISTS dedupkey_created_idx ON notifier_dedupkey (created_at);
"""


def backfill_dedup_keys(apps: Any, schema_editor: Any) -> None:
    """Copy the dedup keys of the window's notifications into the key table (again later: `partitions --dedup`)."""
    notifier.partitions.backfill_dedup_keys(schema_editor.connection.cursor())


def convert(apps: Any, schema_editor: Any) -> None:
    """Bound the tables online, then swap in the partitioned parents in one short transaction."""
    with schema_editor.connection.cursor() as cursor:
        cutovers = notifier.partitions.prepare_conversion(cursor)
    with transaction.atomic(using=schema_editor.connection.alias), schema_editor.connection.cursor() as cursor:
        notifier.partitions.convert(cursor, cutovers)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY and the online VALIDATE cannot run in the migration's transaction.
    atomic = False

    dependencies = [
        ("notifier", "0012_merge_live"),
        ("preferences", "0001_initial"),
        ("templates_app", "0001_initial"),
    ]

    operations = [
        # Nothing may hold a database FK to or from a partitioned hot table (a drop would have to check it,
        # the PK of notifications now includes created_at); the ORM keeps CASCADE and PROTECT.
        migrations.AlterField(
            model_name="fanoutlane",
            name="notification",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="fanout_lanes",
                to="notifier.notification",
            ),
        ),
        migrations.AlterField(
            model_name="deadletter",
            name="delivery",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="dead_letters",
                to="notifier.delivery",
            ),
        ),
        migrations.AlterField(
            model_name="notification",
            name="client",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="notifications",
                to="notifier.apiclient",
            ),
        ),
        migrations.AlterField(
            model_name="notification",
            name="recipient",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="notifications",
                to="preferences.recipient",
            ),
        ),
        migrations.AlterField(
            model_name="notification",
            name="topic",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="notifications",
                to="preferences.topic",
            ),
        ),
        migrations.AlterField(
            model_name="notification",
            name="campaign",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="notifications",
                to="notifier.campaign",
            ),
        ),
        migrations.AlterField(
            model_name="delivery",
            name="template_version",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="templates_app.templateversion",
            ),
        ),
        migrations.AlterField(
            model_name="notification",
            name="id",
            field=models.UUIDField(
                default=notifier.partitions.new_notification_id, editable=False, primary_key=True, serialize=False
            ),
        ),
        migrations.AlterField(
            model_name="notification", name="created_at", field=notifier.models.BirthTimeField(auto_now_add=True)
        ),
        migrations.AlterModelOptions(name="notification", options={"base_manager_name": "objects"}),
        # The unique (client, dedup_key) moves to notifier_dedupkey: a partition's unique index sees one day.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="notification", name="notification_dedup_uniq"),
                # Built by `convert` (concurrently on the old table, then on the parent).
                migrations.AddIndex(
                    model_name="notification",
                    index=models.Index(
                        condition=models.Q(dedup_key__isnull=False),
                        fields=["client", "dedup_key"],
                        name="notification_dedup_idx",
                    ),
                ),
            ],
        ),
        migrations.RunSQL(DEDUP_TABLE, reverse_sql="DROP TABLE IF EXISTS notifier_dedupkey"),
        migrations.RunPython(backfill_dedup_keys, migrations.RunPython.noop),
        migrations.RunPython(convert, migrations.RunPython.noop),
    ]
