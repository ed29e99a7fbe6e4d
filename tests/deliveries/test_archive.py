"""The delivery-log archive against moto's S3 server and the real PostgreSQL: export, read back, restore.

Files are read back with DuckDB and pyarrow, the way an analyst would; restored tables are compared with the
rows they came from.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from notifier.deliveries import archive, partitions
from notifier.deliveries.archive import ArchiveIncomplete, ChecksumMismatch, Storage
from notifier.deliveries.models import Delivery, DeliveryEvent, Notification
from preferences.models import Recipient
from preferences.services import recipient_erase
from tests.factories import make_delivery, move_to_day
from tests.stubs import aws
from tests.stubs.aws import MotoServer

DAY = dt.date(2026, 11, 20)
NOON = dt.datetime(2026, 11, 20, 12, tzinfo=dt.UTC)


@pytest.fixture
def bucket(moto_server: MotoServer, settings: Any) -> Iterator[Any]:
    """A fresh bucket on moto's S3, configured as the archive's; yields a boto3 client of it."""
    client = aws.archive_bucket(moto_server, settings, prefix="archive")
    yield client
    archive.restore_drop(DAY)


def _keys(client: Any) -> dict[str, bytes]:
    """Return every object of the archive's bucket with its body."""
    from django.conf import settings

    found = {}
    for item in client.list_objects_v2(Bucket=settings.ARCHIVE_BUCKET).get("Contents", ()):
        found[item["Key"]] = client.get_object(Bucket=settings.ARCHIVE_BUCKET, Key=item["Key"])["Body"].read()
    return found


def _download(client: Any, into: Path) -> dict[str, Any]:
    """Mirror the bucket under `into` (as `aws s3 sync` would); return the day's manifest."""
    for key, body in _keys(client).items():
        path = into / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    return json.loads((into / archive.manifest_key(DAY)).read_text())


def _at(delivery: Delivery, when: dt.datetime) -> Delivery:
    return move_to_day(delivery, when)


def _day_of_rows(day: dt.date = DAY) -> list[Delivery]:
    """Deliveries on `day` (first and last microsecond included), one the day before and one the day after."""
    start, end = archive.day_bounds(day)
    inside = []
    for when in (start, start + dt.timedelta(hours=12), end - dt.timedelta(microseconds=1)):
        delivery = make_delivery(provider="ses", provider_message_id=f"m-{when.timestamp()}", attempts=1)
        delivery = _at(delivery, when)
        DeliveryEvent.objects.create(delivery=delivery, status="queued", at=when)
        DeliveryEvent.objects.create(delivery=delivery, status="sent", detail="ok", at=when)
        inside.append(delivery)
    for when in (start - dt.timedelta(microseconds=1), end):
        outside = _at(make_delivery(), when)
        DeliveryEvent.objects.create(delivery=outside, status="queued", at=when)
    return inside


@pytest.mark.django_db(transaction=True)
def test_round_trip_export_read_with_duckdb_restore(bucket: Any, tmp_path: Path) -> None:
    inside = _day_of_rows()

    manifest = archive.archive_day(DAY)

    assert manifest["schema_version"] == 1 and manifest["day"] == "2026-11-20"
    assert {name: t["rows"] for name, t in manifest["tables"].items()} == {
        "notification": 3,
        "delivery": 3,
        "delivery_event": 6,
    }
    objects = _keys(bucket)
    assert archive.manifest_key(DAY) == "notifier/v1/manifest/day=2026-11-20/manifest.json"
    for name, table in manifest["tables"].items():
        assert {c["name"] for c in table["columns"]} >= {"id"}
        [file] = table["files"]
        assert file["key"] == f"notifier/v1/{name}/day=2026-11-20/part-0000.parquet"
        assert hashlib.sha256(objects[file["key"]]).hexdigest() == file["sha256"]
        assert len(objects[file["key"]]) == file["bytes"]
    assert set(objects) == {archive.manifest_key(DAY)} | {
        f["key"] for t in manifest["tables"].values() for f in t["files"]
    }

    # An analyst's query: DuckDB over the mirrored layout, the day read from the path (hive partitioning).
    _download(bucket, tmp_path)
    root = tmp_path / "notifier" / "v1"
    rows = duckdb.sql(
        f"""
        SELECT d.id, d.status, d.channel, d.created_at, d.day, count(e.id) AS events
        FROM read_parquet('{root}/delivery/*/*.parquet', hive_partitioning = true) d
        JOIN read_parquet('{root}/delivery_event/*/*.parquet') e ON e.delivery_id = d.id
        GROUP BY ALL ORDER BY d.id
        """
    ).fetchall()
    assert [(r[0], r[1], r[2], r[4], r[5]) for r in rows] == [(d.pk, "sent", "email", DAY, 2) for d in inside]
    # The query of docs/operations.md, as printed there.
    week = duckdb.sql(
        f"""
        SELECT day, channel, status, count(*) AS deliveries
        FROM read_parquet('{root}/delivery/*/*.parquet', hive_partitioning = true)
        WHERE day BETWEEN DATE '2026-11-16' AND DATE '2026-11-22'
        GROUP BY ALL ORDER BY ALL
        """
    ).fetchall()
    assert week == [(DAY, "email", "sent", 3)]
    expected = list(Delivery.objects.filter(pk__in=[d.pk for d in inside]).order_by("pk"))
    assert [r[3] for r in rows] == [d.created_at for d in expected]

    # Restore, compare with the source rows, and the tables are read-only.
    assert archive.restore_day(DAY) == {"notification": 3, "delivery": 3, "delivery_event": 6}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, notification_id, recipient_id, status, provider_message_id, attempts, created_at"
            " FROM archive.delivery_20261120 ORDER BY id"
        )
        restored = cursor.fetchall()
        cursor.execute("SELECT count(*), min(at), max(at) FROM archive.delivery_event_20261120")
        assert cursor.fetchone() == (6, *archive.day_bounds(DAY)[:1], max(d.created_at for d in expected))
    assert restored == [
        (d.pk, str(d.notification_id), d.recipient_id, d.status, d.provider_message_id, d.attempts, d.created_at)
        for d in expected
    ]
    for statement in (
        "UPDATE archive.delivery_20261120 SET status = 'x'",
        "DELETE FROM archive.notification_20261120",
        "INSERT INTO archive.delivery_event_20261120 (id) VALUES (1)",
        "TRUNCATE archive.delivery_20261120",
    ):
        with pytest.raises(DatabaseError, match="read-only restore"), transaction.atomic():
            connection.cursor().execute(statement)

    call_command("restore_day", "2026-11-20", "--drop")
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('archive.delivery_20261120')")
        assert cursor.fetchone() == (None,)


def _strings(table: Any) -> list[str]:
    values = []
    for column in table.columns:
        for value in column.to_pylist():
            if isinstance(value, str):
                values.append(value)
            elif isinstance(value, list):
                values.extend(v for v in value if isinstance(v, str))
    return values


@pytest.mark.django_db
def test_archive_keeps_no_contact_data_and_anonymises_erased_recipients(bucket: Any, tmp_path: Path) -> None:
    erased = Recipient.objects.create(user_id="u-erased", email="gone@example.com", phone="+4915112345678")
    marked = Recipient.objects.create(user_id="u-marked", email="marked@example.com", phone="+4915187654321")
    kept = Recipient.objects.create(user_id="u-kept", email="kept@example.com", phone="+4915100000000")
    token = "fcmTok1:APA91b" + "Xy9_" * 30  # the shape of an FCM registration token
    made = []
    for recipient in (erased, marked, kept):
        for channel, address in (
            ("email", recipient.email),
            ("sms", recipient.phone),
            ("push", token + recipient.user_id),
        ):
            delivery = make_delivery(
                recipient=recipient,
                channel=channel,
                address=address,
                status="failed",
                last_error=f"provider said: {address} is invalid",
                reason=f"bounced {recipient.email}",
                content={"title": f"Hello {recipient.email}"},
            )
            Notification.objects.filter(pk=delivery.notification_id).update(
                payload={"name": "Jane Personal", "email": recipient.email}, dedup_key=f"k-{recipient.email}"
            )
            DeliveryEvent.objects.create(delivery=delivery, status="failed", detail=f"to {address}", at=NOON)
            made.append(_at(delivery, NOON))
    # One erased the regular way (addresses wiped in the live tables, not last_error), one only marked erased
    # (its addresses still in the live rows, as if erased while the export ran).
    recipient_erase(recipient=erased)
    Recipient.objects.filter(pk=marked.pk).update(erased_at=NOON)

    manifest = archive.archive_day(DAY)
    _download(bucket, tmp_path)
    tables = {name: pq.read_table(tmp_path / t["files"][0]["key"]) for name, t in manifest["tables"].items()}

    texts = " ".join(s for table in tables.values() for s in _strings(table))
    for personal in ("@example.com", "+49151", "fcmTok", "APA91b", "Jane Personal"):
        assert personal not in texts, personal
    assert "[email]" in texts and "[phone]" in texts
    assert {c["name"] for c in manifest["tables"]["delivery"]["columns"]}.isdisjoint({"address", "content"})
    assert {c["name"] for c in manifest["tables"]["notification"]["columns"]}.isdisjoint({"payload", "dedup_key"})

    deliveries = tables["delivery"].to_pylist()
    assert len(deliveries) == 9
    for row in deliveries:
        anonymous = row["recipient_id"] in (None,)
        assert row["recipient_erased"] == anonymous
        assert row["recipient_id"] in (None, kept.pk)
    assert sum(r["recipient_erased"] for r in deliveries) == 6
    notifications = tables["notification"].to_pylist()
    assert sorted(n["user_id"] or "-" for n in notifications) == ["-"] * 6 + ["u-kept"] * 3
    assert all(n["recipient_id"] is None for n in notifications if n["recipient_erased"])


class _FailingStorage(Storage):
    """The archive's bucket, with uploads that stop working after `allowed` files (a crash mid-export)."""

    def __init__(self, allowed: int) -> None:
        inner = Storage.from_settings()
        super().__init__(client=inner.client, bucket=inner.bucket)
        self.allowed = allowed

    def upload(self, path: Path, key: str) -> None:
        """Upload, or fail like a lost connection once the allowance is spent."""
        if self.allowed <= 0:
            raise ConnectionError("connection lost")
        self.allowed -= 1
        super().upload(path, key)


@pytest.mark.django_db
def test_export_cut_short_is_not_complete(bucket: Any) -> None:
    _day_of_rows()

    with pytest.raises(ConnectionError):
        archive.archive_day(DAY, storage=_FailingStorage(allowed=1))
    assert any("/notification/day=2026-11-20/" in key for key in _keys(bucket))  # a file made it
    assert not archive.archive_complete(DAY)
    with pytest.raises(ArchiveIncomplete, match="not archived"):
        archive.restore_day(DAY)
    with pytest.raises(CommandError, match="not archived"):
        call_command("restore_day", "2026-11-20")

    # A complete export, then a re-export that dies: the day is incomplete again, not "complete" with half
    # of its files replaced.
    archive.archive_day(DAY)
    assert archive.archive_complete(DAY)
    with pytest.raises(ConnectionError):
        archive.archive_day(DAY, storage=_FailingStorage(allowed=2))
    assert not archive.archive_complete(DAY)


@pytest.mark.django_db
def test_re_export_is_idempotent_and_files_are_bounded(bucket: Any, settings: Any) -> None:
    for hour in range(5):
        _at(make_delivery(), NOON + dt.timedelta(hours=hour))
    # A file is closed after every row group of two rows: the day's deliveries come in three files.
    settings.ARCHIVE_BATCH_ROWS = 2
    settings.ARCHIVE_FILE_BYTES = 1

    first = archive.archive_day(DAY)
    objects = _keys(bucket)
    second = archive.archive_day(DAY)

    files = first["tables"]["delivery"]["files"]
    assert [f["rows"] for f in files] == [2, 2, 1]
    assert second["tables"] == first["tables"]  # same keys, rows and checksums
    assert _keys(bucket).keys() == objects.keys()

    # Larger files: one part, and the parts the earlier export wrote beyond it are gone.
    settings.ARCHIVE_BATCH_ROWS = 1000
    settings.ARCHIVE_FILE_BYTES = 1 << 30
    third = archive.archive_day(DAY)
    assert [f["key"] for f in third["tables"]["delivery"]["files"]] == [files[0]["key"]]
    assert not [key for key in _keys(bucket) if key.endswith(("part-0001.parquet", "part-0002.parquet"))]
    assert archive.restore_day(DAY)["delivery"] == 5


@pytest.mark.django_db
def test_restore_refuses_a_file_that_differs_from_its_manifest(bucket: Any) -> None:
    _day_of_rows()
    manifest = archive.archive_day(DAY)
    key = manifest["tables"]["delivery_event"]["files"][0]["key"]
    body = bucket.get_object(Bucket=bucket_name(), Key=key)["Body"].read()
    bucket.put_object(Bucket=bucket_name(), Key=key, Body=body[:-1] + bytes([body[-1] ^ 1]))

    with pytest.raises(ChecksumMismatch, match="delivery_event"):
        archive.restore_day(DAY)
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('archive.notification_20261120')")
        assert cursor.fetchone() == (None,)  # one transaction: the tables loaded before it are gone too


def bucket_name() -> str:
    """Return the archive's bucket of the running test."""
    from django.conf import settings

    return settings.ARCHIVE_BUCKET


@pytest.mark.django_db
def test_commands_and_an_empty_day(bucket: Any, settings: Any) -> None:
    call_command("archive_day", "2026-11-20")
    assert archive.manifest_get(DAY)["tables"]["delivery"]["rows"] == 0
    call_command("restore_day", "2026-11-20")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM archive.delivery_20261120")
        assert cursor.fetchone() == (0,)

    with pytest.raises(CommandError, match="not a date"):
        call_command("archive_day", "2026-13-01")
    settings.ARCHIVE_BUCKET = ""
    with pytest.raises(CommandError, match="ARCHIVE_BUCKET"):
        call_command("archive_day", "2026-11-20")
    archive.archive_before_drop(DAY)  # archiving off: it does not raise, so the drop may go ahead


@pytest.mark.django_db
def test_one_export_of_a_day_at_a_time(bucket: Any) -> None:
    import psycopg

    params = connection.settings_dict
    dsn = f"host={params['HOST']} port={params['PORT'] or 5432} user={params['USER']} dbname={params['NAME']}"
    with psycopg.connect(dsn, autocommit=False) as other:
        other.execute("SELECT pg_advisory_xact_lock(hashtext('notifier.deliveries.archive'), %s)", [DAY.toordinal()])
        with pytest.raises(archive.ArchiveError, match="another process"):
            archive.archive_day(DAY)
        archive.archive_day(DAY + dt.timedelta(days=1))  # another day is not held up
    archive.archive_day(DAY)
    assert archive.archive_complete(DAY)


@pytest.mark.django_db
def test_a_day_of_a_partitioned_table_reads_only_its_partition(bucket: Any, tmp_path: Path) -> None:
    """Each table's day is read by its partition key: the plan touches that day's partition only.

    The day is one of the days made ahead, with partitions of its own and its neighbours' (notifier/deliveries/
    partitions.py).
    """
    day = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=2)
    inside = _day_of_rows(day)
    with connection.cursor() as cursor:
        for table in archive.TABLES:
            bounds = partitions.day_bounds(table.partition_table, day)
            cursor.execute("EXPLAIN (FORMAT JSON) " + table.select_sql(), list(bounds))
            plan = json.dumps(cursor.fetchone()[0])
            assert partitions.partition_name(table.partition_table, day) in plan, table.name
            for other in (day - dt.timedelta(days=1), day + dt.timedelta(days=1)):
                assert partitions.partition_name(table.partition_table, other) not in plan, table.name

    entry = archive._export_table(archive.DELIVERY, day, Storage.from_settings(), tmp_path)
    [file] = entry["files"]
    bucket.download_file(bucket_name(), file["key"], str(tmp_path / "part.parquet"))
    assert sorted(pq.read_table(tmp_path / "part.parquet")["id"].to_pylist()) == sorted(d.pk for d in inside)
