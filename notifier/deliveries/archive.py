"""Archive of the delivery log: one day of notifications, deliveries and events to object storage, and back.

A day (00:00 to 24:00 UTC) is read with a range query on each parent table's partition key
(notifier/deliveries/partitions.py: `created_at` for notifications, the day-carrying id for deliveries and `delivery_id`
for events, so a delivery's events travel with it), so the rows archived are exactly the partition's, through
a server-side cursor in batches of ARCHIVE_BATCH_ROWS (memory is bounded by the batch, not by the day). Each
batch becomes one Parquet row group (zstd); a file is closed once it passes ARCHIVE_FILE_BYTES and uploaded
with boto3 (multipart above ARCHIVE_UPLOAD_PART_BYTES). Layout, for schema version 1:

    <prefix>/v1/<table>/day=YYYY-MM-DD/part-0000.parquet      table: notification, delivery, delivery_event
    <prefix>/v1/manifest/day=YYYY-MM-DD/manifest.json

The manifest (schema version, columns and types, row counts, each file's size and sha256, export time) is
deleted first and written last: a day without a manifest is not archived, whatever files it has, so an
export cut short is never taken for a complete one. Re-exporting a day writes the same keys again and
deletes parts the new export no longer has.

Personal data (docs/decisions/0052-archive-keeps-no-contact-data.md): the archive keeps no contact data at
all (no delivery address, no rendered content, no request payload, no dedup key); free-text fields (reason,
last_error, event detail) are masked like log lines. Rows of a recipient erased before the export are
anonymised: recipient_id and user_id are left out and `recipient_erased` is true, so counts (billing,
analytics) still add up.

A recipient erased after the export is anonymised in the files too: `archive_forget_recipient` rewrites each
archived day's notification and delivery files that hold their rows the same way (ids null, `recipient_erased`
true), and the day's event files where they hold clicks on those deliveries (the URL cut, the source kept, as
in the live rows), under the day's export lock, with the manifest removed while the files change and
rewritten with their new sizes and checksums; a restored copy of such a day is restored again from the
rewritten files.

`restore_day` reads a manifest, verifies each file's sha256 before loading it and loads the day into
read-only tables `archive.<table>_YYYYMMDD` for an investigation; `restore_drop` removes them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core import progress
from core.db import estimated_rows
from core.logs import get_logger, mask_text
from notifier.deliveries import partitions
from notifier.deliveries.models import Delivery, DeliveryEvent, Notification
from notifier.deliveries.status import CLICKED
from preferences.models import Recipient

logger = get_logger(__name__)

SCHEMA_VERSION = 1
FILE_FORMAT = "parquet"
COMPRESSION = "zstd"
RESTORE_SCHEMA = "archive"


class ArchiveError(Exception):
    """The archive cannot do what was asked; the message says why."""


class ArchiveDisabled(ArchiveError):
    """No ARCHIVE_BUCKET is configured."""


class ArchiveIncomplete(ArchiveError):
    """A day has no manifest: it was never archived, or its export did not finish."""


class ChecksumMismatch(ArchiveError):
    """A file's sha256 differs from the one its manifest recorded."""


# Logical column types: (Arrow type written to Parquet, PostgreSQL type of a restored table).
TYPES: dict[str, tuple[pa.DataType, str]] = {
    "string": (pa.string(), "text"),
    "int64": (pa.int64(), "bigint"),
    "bool": (pa.bool_(), "boolean"),
    "timestamp": (pa.timestamp("us", tz="UTC"), "timestamptz"),
    "string[]": (pa.list_(pa.string()), "text[]"),
}


@dataclass(frozen=True)
class Column:
    """One archived column: its name, the SQL that reads it, its logical type, and whether text is masked."""

    name: str
    sql: str
    type: str
    mask: bool = False


@dataclass(frozen=True)
class Table:
    """One archived table: the rows of a day come from `source` where `day_column` falls in the day."""

    name: str
    source: str
    # The partitioned table the day is cut from, and its partition key (notifier/deliveries/partitions.py): a day's
    # rows are the ones its partition holds, so the archive and the drop agree on every row.
    partition_table: str
    day_column: str
    columns: tuple[Column, ...]

    def select_sql(self) -> str:
        """Return the SELECT of one day's rows (two parameters: the day's start and end)."""
        cols = ", ".join(_read_as(c) for c in self.columns)
        # Every piece is a constant of this module, none comes from input.
        where = f"{self.day_column} >= %s AND {self.day_column} < %s"
        return f"SELECT {cols} FROM {self.source} WHERE {where}"  # noqa: S608

    def arrow_schema(self) -> pa.Schema:
        """Return the Parquet schema of this table."""
        return pa.schema([pa.field(c.name, TYPES[c.type][0]) for c in self.columns])


def _read_as(column: Column) -> str:
    """Return the SQL that reads a column: timestamps as microseconds since the epoch.

    An integer crosses the wire and lands in Arrow without a Python datetime per value (that parsing was the
    largest part of the export's CPU); Arrow stores timestamp[us] as exactly this integer.
    """
    if column.type == "timestamp":
        return f"(extract(epoch FROM {column.sql}) * 1000000)::int8"
    return column.sql


def _plain(table: str, names: str, kind: str) -> tuple[Column, ...]:
    return tuple(Column(name, f"{table}.{name}", kind) for name in names.split())


_RECIPIENT = Recipient._meta.db_table
_ERASED = "r.erased_at IS NOT NULL"

NOTIFICATION = Table(
    name="notification",
    source=f"{Notification._meta.db_table} n LEFT JOIN {_RECIPIENT} r ON r.id = n.recipient_id",
    partition_table=partitions.NOTIFICATION,
    day_column=f"n.{partitions.KEYS[partitions.NOTIFICATION]}",
    columns=(
        Column("id", "n.id::text", "string"),
        *_plain("n", "client_id", "int64"),
        *_plain("n", "category template_key", "string"),
        *_plain("n", "template_version", "int64"),
        *_plain("n", "channels", "string[]"),
        Column("recipient_id", f"CASE WHEN {_ERASED} THEN NULL ELSE n.recipient_id END", "int64"),
        Column("user_id", f"CASE WHEN {_ERASED} THEN NULL ELSE n.user_id END", "string"),
        Column("recipient_erased", f"{_ERASED}", "bool"),
        *_plain("n", "topic_id campaign_id", "int64"),
        *_plain("n", "priority locale", "string"),
        *_plain("n", "send_at", "timestamp"),
        *_plain("n", "send_at_local strategy fallback_until", "string"),
        *_plain("n", "fallback_after_seconds", "int64"),
        *_plain("n", "status", "string"),
        *_plain("n", "recipients_total fanout_processed", "int64"),
        *_plain("n", "trace_id", "string"),
        *_plain("n", "created_at updated_at", "timestamp"),
    ),
)

DELIVERY = Table(
    name="delivery",
    source=f"{Delivery._meta.db_table} d LEFT JOIN {_RECIPIENT} r ON r.id = d.recipient_id",
    partition_table=partitions.DELIVERY,
    day_column=f"d.{partitions.KEYS[partitions.DELIVERY]}",
    columns=(
        *_plain("d", "id", "int64"),
        Column("notification_id", "d.notification_id::text", "string"),
        Column("recipient_id", f"CASE WHEN {_ERASED} THEN NULL ELSE d.recipient_id END", "int64"),
        Column("recipient_erased", f"{_ERASED}", "bool"),
        *_plain("d", "channel priority status", "string"),
        Column("reason", "d.reason", "string", mask=True),
        *_plain("d", "provider provider_message_id pinned_provider", "string"),
        *_plain("d", "attempts", "int64"),
        Column("last_error", "d.last_error", "string", mask=True),
        *_plain("d", "not_before published_at claimed_at sent_at read_at", "timestamp"),
        *_plain("d", "template_version_id", "int64"),
        *_plain("d", "sms_encoding", "string"),
        *_plain("d", "sms_segments resent_from_id", "int64"),
        *_plain("d", "created_at updated_at", "timestamp"),
    ),
)

DELIVERY_EVENT = Table(
    name="delivery_event",
    source=f"{DeliveryEvent._meta.db_table} e",
    partition_table=partitions.EVENT,
    day_column=f"e.{partitions.KEYS[partitions.EVENT]}",
    columns=(
        *_plain("e", "id delivery_id", "int64"),
        *_plain("e", "status", "string"),
        Column("detail", "e.detail", "string", mask=True),
        *_plain("e", "at", "timestamp"),
    ),
)

TABLES: tuple[Table, ...] = (NOTIFICATION, DELIVERY, DELIVERY_EVENT)


def day_bounds(day: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """Return the UTC instants a day starts and ends at (end exclusive)."""
    start = dt.datetime.combine(day, dt.time.min, tzinfo=dt.UTC)
    return start, start + dt.timedelta(days=1)


def _version_prefix() -> str:
    return f"{settings.ARCHIVE_PREFIX}/v{SCHEMA_VERSION}" if settings.ARCHIVE_PREFIX else f"v{SCHEMA_VERSION}"


def table_prefix(table: str, day: dt.date) -> str:
    """Return the key prefix (ending in "/") of one table's files for one day."""
    return f"{_version_prefix()}/{table}/day={day.isoformat()}/"


def manifest_key(day: dt.date) -> str:
    """Return the key of a day's manifest."""
    return f"{_version_prefix()}/manifest/day={day.isoformat()}/manifest.json"


class Storage:
    """The archive's bucket through boto3's S3 client."""

    def __init__(self, *, client: Any, bucket: str) -> None:
        self.client = client
        self.bucket = bucket
        part = max(5 * 1024 * 1024, settings.ARCHIVE_UPLOAD_PART_BYTES)  # S3's smallest multipart part
        self.transfer = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=4)

    @classmethod
    def from_settings(cls) -> Storage:
        """Return the configured bucket, or raise ArchiveDisabled when ARCHIVE_BUCKET is empty."""
        if not settings.ARCHIVE_BUCKET:
            raise ArchiveDisabled("archiving is off: ARCHIVE_BUCKET is not set")
        session = boto3.session.Session(
            aws_access_key_id=settings.ARCHIVE_AWS_ACCESS_KEY_ID or None,
            aws_secret_access_key=settings.ARCHIVE_AWS_SECRET_ACCESS_KEY or None,
            region_name=settings.ARCHIVE_S3_REGION,
        )
        endpoint = settings.ARCHIVE_S3_ENDPOINT_URL or None
        config = Config(
            retries={"max_attempts": 5, "mode": "standard"},
            # S3 stand-ins (MinIO, moto) are addressed by path; AWS itself by virtual host.
            s3={"addressing_style": "path" if endpoint else "auto"},
        )
        return cls(client=session.client("s3", endpoint_url=endpoint, config=config), bucket=settings.ARCHIVE_BUCKET)

    def upload(self, path: Path, key: str) -> None:
        """Upload a local file (in parts when it is large)."""
        self.client.upload_file(str(path), self.bucket, key, Config=self.transfer)

    def download(self, key: str, path: Path) -> None:
        """Download an object to a local file."""
        self.client.download_file(self.bucket, key, str(path), Config=self.transfer)

    def put_json(self, key: str, data: dict[str, Any]) -> None:
        """Write a small JSON object."""
        body = json.dumps(data, indent=2, sort_keys=True).encode()
        self.client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json")

    def get_json(self, key: str) -> dict[str, Any] | None:
        """Read a small JSON object, or None if there is none under `key`."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                return None
            raise
        return json.loads(body)

    def keys(self, prefix: str) -> list[str]:
        """Return every key under `prefix`."""
        found: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            found.extend(item["Key"] for item in page.get("Contents", ()))
        return found

    def delete(self, keys: Sequence[str]) -> None:
        """Delete objects (absent ones are fine)."""
        for start in range(0, len(keys), 1000):
            chunk = [{"Key": key} for key in keys[start : start + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def _day_snapshot() -> Iterator[None]:
    """Read the three tables in one transaction: one snapshot, no parallel workers taken from live traffic."""
    outer = connection.in_atomic_block
    with transaction.atomic():
        with connection.cursor() as cursor:
            if not outer:
                # One snapshot for the three tables: a day's deliveries and their notifications agree.
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            # Serial scans: the export is background work, and a serial scan returns rows in a stable order,
            # so exporting unchanged rows twice gives the same files.
            cursor.execute("SET LOCAL max_parallel_workers_per_gather = 0")
        yield


def _arrow_batch(table: Table, schema: pa.Schema, rows: list[tuple[Any, ...]]) -> pa.Table:
    columns = list(zip(*rows, strict=True))
    arrays = []
    for column, values in zip(table.columns, columns, strict=True):
        if column.mask:
            values = tuple(mask_text(v) if v else v for v in values)
        arrays.append(pa.array(values, type=TYPES[column.type][0]))
    return pa.Table.from_arrays(arrays, schema=schema)


class _Parts:
    """The Parquet files of one table's day: written to a local file one at a time, uploaded when closed."""

    def __init__(self, *, schema: pa.Schema, prefix: str, storage: Storage, workdir: Path) -> None:
        self.schema = schema
        self.prefix = prefix
        self.storage = storage
        self.workdir = workdir
        self.files: list[dict[str, Any]] = []
        self.writer: pq.ParquetWriter | None = None

    def write(self, batch: pa.Table) -> None:
        """Append one row group; close the file once it has passed ARCHIVE_FILE_BYTES."""
        if self.writer is None:
            self._open()
        assert self.writer is not None
        self.writer.write_table(batch, row_group_size=batch.num_rows)
        self.rows += batch.num_rows
        if self.sink.tell() >= settings.ARCHIVE_FILE_BYTES:
            self._close()

    def finish(self) -> list[dict[str, Any]]:
        """Close the last file and return the manifest entries of all of them."""
        if self.writer is None and not self.files:
            self._open()  # a day without rows still gets one (empty) file: readers see the schema, not a 404
        if self.writer is not None:
            self._close()
        return self.files

    def _open(self) -> None:
        self.path = self.workdir / f"part-{len(self.files):04d}.{FILE_FORMAT}"
        self.rows = 0
        self.sink = pa.OSFile(str(self.path), "wb")
        self.writer = pq.ParquetWriter(self.sink, self.schema, compression=COMPRESSION)

    def _close(self) -> None:
        assert self.writer is not None
        self.writer.close()
        self.sink.close()
        self.writer = None
        key = f"{self.prefix}{self.path.name}"
        size = self.path.stat().st_size
        self.files.append({"key": key, "rows": self.rows, "bytes": size, "sha256": _sha256(self.path)})
        self.storage.upload(self.path, key)
        self.path.unlink()


def _export_table(table: Table, day: dt.date, storage: Storage, workdir: Path) -> dict[str, Any]:
    """Write one table's rows of `day` as Parquet files, upload them, and return the table's manifest entry."""
    start, end = partitions.day_bounds(table.partition_table, day)
    schema = table.arrow_schema()
    prefix = table_prefix(table.name, day)
    parts = _Parts(schema=schema, prefix=prefix, storage=storage, workdir=workdir)
    batch = max(1, settings.ARCHIVE_BATCH_ROWS)
    estimate = estimated_rows(partitions.partition_name(table.partition_table, day))
    connection.ensure_connection()
    with (
        progress.task(f"archive {table.name} {day.isoformat()}", total=estimate, estimated=True) as work,
        connection.connection.cursor(name=f"archive_{table.name}") as cursor,
    ):
        cursor.itersize = batch
        cursor.execute(table.select_sql(), [start, end])
        while rows := cursor.fetchmany(batch):
            parts.write(_arrow_batch(table, schema, rows))
            work.advance(len(rows))
    files = parts.finish()
    # Parts a previous export of this day wrote beyond this one's last.
    stale = sorted(set(storage.keys(prefix)) - {f["key"] for f in files})
    storage.delete(stale)
    return {
        "day_column": table.day_column.split(".")[-1],
        "rows": sum(f["rows"] for f in files),
        "bytes": sum(f["bytes"] for f in files),
        "columns": [{"name": c.name, "type": c.type} for c in table.columns],
        "files": files,
    }


def _lock_day(day: dt.date) -> None:
    """Hold the day's export lock until the transaction ends, or raise if another export of it holds it.

    Two exports of one day at once would interleave their files and leave a manifest that vouches for the
    other's; PostgreSQL's advisory lock is the one lock every process of the installation shares.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_try_advisory_xact_lock(hashtext('notifier.deliveries.archive'), %s)", [day.toordinal()]
        )
        if not cursor.fetchone()[0]:
            raise ArchiveError(f"{day.isoformat()} is being exported by another process")


def archive_day(day: dt.date, *, storage: Storage | None = None) -> dict[str, Any]:
    """Export one day of notifications, deliveries and events to the archive and return its manifest.

    Raises ArchiveDisabled when no bucket is configured, and any storage or database error as it comes: the
    day's manifest is then absent, so the day counts as not archived.
    """
    storage = storage or Storage.from_settings()
    began = time.monotonic()
    start, end = day_bounds(day)
    tables: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="notifier-archive-") as tmp, _day_snapshot():
        _lock_day(day)
        # Remove the old manifest before touching any file: from now until the new one is written, the day is
        # incomplete, never "complete" with files that are half replaced.
        storage.delete([manifest_key(day)])
        for table in TABLES:
            tables[table.name] = _export_table(table, day, storage, Path(tmp))
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "day": day.isoformat(),
            "range": {"from": start.isoformat(), "to": end.isoformat()},
            "format": FILE_FORMAT,
            "compression": COMPRESSION,
            "exported_at": timezone.now().isoformat(),
            "tables": tables,
        }
        storage.put_json(manifest_key(day), manifest)
    logger.info(
        "archive.exported",
        day=day.isoformat(),
        rows={name: t["rows"] for name, t in tables.items()},
        bytes=sum(t["bytes"] for t in tables.values()),
        seconds=round(time.monotonic() - began, 3),
    )
    return manifest


def archive_before_drop(day: dt.date) -> None:
    """Archive `day` before its partitions are dropped; do nothing when archiving is off.

    The hook of partition retention: it raises when the export fails, and the drop must not go ahead then.
    """
    if not settings.ARCHIVE_BUCKET:
        logger.info("archive.off", day=day.isoformat())
        return
    archive_day(day)


def manifest_get(day: dt.date, *, storage: Storage | None = None) -> dict[str, Any]:
    """Return a day's manifest, or raise ArchiveIncomplete when it has none."""
    storage = storage or Storage.from_settings()
    manifest = storage.get_json(manifest_key(day))
    if manifest is None:
        raise ArchiveIncomplete(f"{day.isoformat()} is not archived: no manifest (never exported, or cut short)")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        version = manifest.get("schema_version")
        raise ArchiveError(f"{day.isoformat()} has schema version {version}; this code reads {SCHEMA_VERSION}")
    return manifest


def archive_complete(day: dt.date, *, storage: Storage | None = None) -> bool:
    """Return whether a day has a complete export (its manifest exists)."""
    try:
        manifest_get(day, storage=storage)
    except ArchiveIncomplete:
        return False
    return True


def restored_table_name(table: str, day: dt.date) -> str:
    """Return the schema-qualified name of a restored table."""
    return f"{RESTORE_SCHEMA}.{table}_{day.strftime('%Y%m%d')}"


_READ_ONLY_FUNCTION = f"""
CREATE OR REPLACE FUNCTION {RESTORE_SCHEMA}.read_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%.% is a read-only restore of the archive', TG_TABLE_SCHEMA, TG_TABLE_NAME;
END $$
"""


def _load_file(cursor: Any, name: str, columns: list[str], path: Path, work: progress.Task) -> int:
    parquet = pq.ParquetFile(path)
    copied = 0
    with cursor.copy(f"COPY {name} ({', '.join(columns)}) FROM STDIN") as copy:
        for batch in parquet.iter_batches(columns=columns):
            for row in zip(*(col.to_pylist() for col in batch.columns), strict=True):
                copy.write_row(row)
            copied += batch.num_rows
            work.advance(batch.num_rows)
    return copied


def restore_day(day: dt.date, *, storage: Storage | None = None) -> dict[str, int]:
    """Load an archived day into read-only tables archive.<table>_YYYYMMDD; return the rows per table.

    Each file's sha256 is checked against the manifest before it is loaded, and everything happens in one
    transaction: a bad file leaves no table behind. Tables restored before for the same day are replaced.
    """
    storage = storage or Storage.from_settings()
    manifest = manifest_get(day, storage=storage)
    loaded: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="notifier-restore-") as tmp, transaction.atomic():
        connection.ensure_connection()
        with connection.connection.cursor() as cursor:
            cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {RESTORE_SCHEMA}")
            cursor.execute(_READ_ONLY_FUNCTION)
            for table_name, entry in manifest["tables"].items():
                name = restored_table_name(table_name, day)
                columns = [c["name"] for c in entry["columns"]]
                ddl = ", ".join(f"{c['name']} {TYPES[c['type']][1]}" for c in entry["columns"])
                cursor.execute(f"DROP TABLE IF EXISTS {name}")
                cursor.execute(f"CREATE TABLE {name} ({ddl})")
                rows = 0
                with progress.task(f"restore {name}", total=entry["rows"]) as work:
                    for file in entry["files"]:
                        path = Path(tmp) / Path(file["key"]).name
                        storage.download(file["key"], path)
                        if _sha256(path) != file["sha256"]:
                            raise ChecksumMismatch(f"{file['key']}: sha256 differs from the manifest's")
                        rows += _load_file(cursor, name, columns, path, work)
                        path.unlink()
                if rows != entry["rows"]:
                    raise ArchiveError(f"{table_name}: {rows} rows loaded, the manifest says {entry['rows']}")
                # Read-only for everyone: no write privilege, and a trigger that stops the owner too.
                cursor.execute(f"REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON {name} FROM PUBLIC")
                cursor.execute(
                    f"CREATE TRIGGER read_only BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {name} "
                    f"FOR EACH STATEMENT EXECUTE FUNCTION {RESTORE_SCHEMA}.read_only()"
                )
                comment = f"Read-only restore of {table_name}, {day.isoformat()}, exported {manifest['exported_at']}"
                cursor.execute(f"COMMENT ON TABLE {name} IS %s", [comment])
                loaded[table_name] = rows
    logger.info("archive.restored", day=day.isoformat(), rows=loaded)
    return loaded


def restore_drop(day: dt.date) -> list[str]:
    """Drop the restored tables of a day; return the names dropped."""
    dropped = []
    with transaction.atomic(), connection.cursor() as cursor:
        for table in TABLES:
            name = restored_table_name(table.name, day)
            cursor.execute("SELECT to_regclass(%s)", [name])
            if cursor.fetchone()[0] is not None:
                cursor.execute(f"DROP TABLE {name}")
                dropped.append(name)
    return dropped


# The columns that name a recipient, per archived table, and what an erased recipient's row gets instead.
_RECIPIENT_COLUMNS = {"notification": ("recipient_id", "user_id"), "delivery": ("recipient_id",)}


def _anonymise_file(path: Path, recipient_id: int, columns: tuple[str, ...]) -> list[Any] | None:
    """Rewrite one Parquet file with the recipient's rows anonymised; return their `id`s, or None if it holds none.

    The ids are the deliveries' for a delivery file (their clicks are forgotten next), not needed otherwise.
    """
    data = pq.read_table(path)
    hits = pc.fill_null(pc.equal(data["recipient_id"], recipient_id), False)
    if not pc.any(hits).as_py():
        return None
    ids = data["id"].filter(hits).to_pylist()
    for name in (*columns, "recipient_erased"):
        index = data.schema.get_field_index(name)
        field = data.schema.field(index)
        value = pa.scalar(True, field.type) if name == "recipient_erased" else pa.scalar(None, field.type)
        data = data.set_column(index, field, pc.if_else(hits, value, data[name]))
    pq.write_table(data, path, compression=COMPRESSION)
    return ids


def _forget_clicks_file(path: Path, delivery_ids: list[int]) -> bool:
    """Rewrite one delivery_event file with the clicks on `delivery_ids` cut to their source; False if none.

    The same as an erasure does to the live rows (notifier/deliveries/erasure.py): a click's detail is "<source>
    <url>", and the URL may carry the recipient's data (masking only catches what looks like contact data).
    """
    data = pq.read_table(path)
    hits = pc.and_(
        pc.equal(data["status"], CLICKED),
        pc.is_in(data["delivery_id"], value_set=pa.array(delivery_ids, pa.int64())),
    )
    hits = pc.fill_null(hits, False)
    if not pc.any(hits).as_py():
        return False
    index = data.schema.get_field_index("detail")
    source = pc.replace_substring_regex(data["detail"], pattern="(?s) .*", replacement="")
    data = data.set_column(index, data.schema.field(index), pc.if_else(hits, source, data["detail"]))
    pq.write_table(data, path, compression=COMPRESSION)
    return True


def _archived_days(storage: Storage, since: dt.date | None) -> list[dt.date]:
    days = []
    for key in storage.keys(f"{_version_prefix()}/manifest/"):
        try:
            day = dt.date.fromisoformat(key.split("day=", 1)[1].split("/", 1)[0])
        except (IndexError, ValueError):
            continue
        if since is None or day >= since:
            days.append(day)
    return sorted(days)


def archive_forget_recipient(
    *, recipient_id: int, since: dt.date | None = None, storage: Storage | None = None
) -> list[dt.date]:
    """Anonymise an erased recipient's rows in every archived day from `since`; return the days rewritten.

    Only the recipient's columns change (`recipient_id`, `user_id` null, `recipient_erased` true), and the URLs
    of the clicks on their deliveries (the detail keeps the click's source): the archive never held their
    contact data or content. Raises ArchiveDisabled when no bucket is configured.
    """
    storage = storage or Storage.from_settings()
    rewritten = []
    for day in _archived_days(storage, since):
        with tempfile.TemporaryDirectory(prefix="notifier-erase-") as tmp, transaction.atomic():
            _lock_day(day)
            key = manifest_key(day)
            manifest = storage.get_json(key)
            if manifest is None or manifest.get("schema_version") != SCHEMA_VERSION:
                continue
            changed: list[tuple[dict[str, Any], Path]] = []
            delivery_ids: list[int] = []
            for table_name, columns in _RECIPIENT_COLUMNS.items():
                entry = manifest["tables"].get(table_name) or {"files": []}
                for file in entry["files"]:
                    path = Path(tmp) / f"{table_name}-{Path(file['key']).name}"
                    storage.download(file["key"], path)
                    ids = _anonymise_file(path, recipient_id, columns)
                    if ids is None:
                        path.unlink()
                        continue
                    changed.append((file, path))
                    if table_name == DELIVERY.name:
                        delivery_ids.extend(ids)
            # A delivery's events are archived with its day (their partition key is the delivery id).
            events = manifest["tables"].get(DELIVERY_EVENT.name) or {"files": []}
            for file in events["files"] if delivery_ids else []:
                path = Path(tmp) / f"{DELIVERY_EVENT.name}-{Path(file['key']).name}"
                storage.download(file["key"], path)
                if _forget_clicks_file(path, delivery_ids):
                    changed.append((file, path))
                else:
                    path.unlink()
            if not changed:
                continue
            # As an export does: without a manifest the day is incomplete while its files are replaced.
            storage.delete([key])
            for file, path in changed:
                storage.upload(path, file["key"])
                file.update(bytes=path.stat().st_size, sha256=_sha256(path))
            for entry in manifest["tables"].values():
                entry["bytes"] = sum(f["bytes"] for f in entry["files"])
            manifest["erasure_applied_at"] = timezone.now().isoformat()
            storage.put_json(key, manifest)
            rewritten.append(day)
    for day in rewritten:
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass(%s)", [restored_table_name("notification", day)])
            restored = cursor.fetchone()[0] is not None
        if restored:
            restore_day(day, storage=storage)
    logger.info("archive.erasure_applied", days=[d.isoformat() for d in rewritten])
    return rewritten
