# ruff: noqa: S608 - SQL here is built from table names and bounds computed in this module, never from input.
"""Daily partitions of the hot tables: ids that carry their day, partitions made ahead, days dropped behind.

Three tables are declaratively partitioned by RANGE, one partition per UTC day, named `<table>_pYYYYMMDD`:

- `notifier_notification` on `created_at`. Notification ids are UUIDv7, whose first 48 bits are the creation
  time in milliseconds, so a lookup by id adds the `created_at` range that id implies (`notification_range`)
  and touches one partition (two within NOTIFICATION_ID_SLACK of midnight).
- `notifier_delivery` on `id`. A delivery id is `days_since_epoch << 37 | sequence` (`delivery_id_day`), so a
  lookup by id (claim, outcome write, resend, API) is pruned by PostgreSQL itself, with no extra predicate.
  The id stays below 2^53 until the year 2149, so it is exact as a JSON number in JavaScript (the inbox
  widget, browsers, any JS client); with a 40-bit shift today's ids were already past 2^54 and the widget
  marked the wrong item read.
- `notifier_deliveryevent` on `delivery_id`, with the deliveries' ranges: a delivery's events live in the
  same day as the delivery and go with it.

The initial migration creates the three tables partitioned (`partition_new_tables`) with today's partitions
and PARTITIONS_AHEAD_DAYS more; the maintenance task makes the coming days' ahead and drops the days past
the hot window.

The interface the archive (notifier/deliveries/archive.py) builds on: `day_partitions`, `day_filter` (the predicate
that selects exactly one day's rows of a table from its parent), `ensure_partitions` and `drop_day`, which
calls `archive(day)` while the day is still attached and readable through the parent tables.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from core import progress, task_names
from notifier.deliveries import dedup

logger = logging.getLogger(__name__)

NOTIFICATION = "notifier_notification"
DELIVERY = "notifier_delivery"
EVENT = "notifier_deliveryevent"
# Children before parents: the order in which a day's partitions are detached and dropped.
TABLES = (EVENT, DELIVERY, NOTIFICATION)
# The partition key of each table.
KEYS = {NOTIFICATION: "created_at", DELIVERY: "id", EVENT: "delivery_id"}

EPOCH = date(1970, 1, 1)
# 16 bits of day and 37 of sequence: 2^53 - 1 (JavaScript's Number.MAX_SAFE_INTEGER) is the last id of
# 2149-06-06, and 137 billion deliveries a day is far beyond the seed's volume.
DAY_SHIFT = 37
MAX_SAFE_ID = 2**53 - 1
SEQUENCE_MASK = (1 << DAY_SHIFT) - 1
# The most a notification's created_at may differ from the time in its UUIDv7 (both are taken in Python
# while one request is handled); a lookup by id searches this far either side.
NOTIFICATION_ID_SLACK = timedelta(minutes=10)
# The last instant a datetime holds, and the last day number whose next day a date still holds. A UUIDv7's
# 48 bits of milliseconds reach the year 10889 and a bigint's day bits far further: no row carries such an id
# (none is made past today), so a lookup by one is bounded by these instead, and still reads no partition.
LATEST = datetime.max.replace(tzinfo=UTC)
_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST_MILLIS = (LATEST - _UNIX_EPOCH) // timedelta(milliseconds=1)
_LAST_DAY_NUMBER = (date.max - EPOCH).days - 1
# How long one DDL statement may wait for its lock before giving up (the maintenance task retries later),
# so a detach or attach never queues the live traffic behind it.
LOCK_TIMEOUT = "3s"

_PARTITION_NAME = re.compile(r"^(?P<table>.+)_p(?P<day>\d{8})$")


def hot_days() -> int:
    """Return DELIVERY_HOT_DAYS: how many days (today included) stay in the partitioned tables."""
    return int(getattr(settings, "DELIVERY_HOT_DAYS", 14))


def dedup_window() -> timedelta:
    """Return DEDUP_WINDOW_HOURS as a timedelta: how long a dedup_key answers with its first notification."""
    return timedelta(hours=int(getattr(settings, "DEDUP_WINDOW_HOURS", 72)))


# ---- ids and days ---------------------------------------------------------------------------------------


def uuid7(at: datetime | None = None) -> uuid.UUID:
    """Return a new UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits."""
    moment = at or timezone.now()
    millis = int(moment.timestamp() * 1000) & ((1 << 48) - 1)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis << 80) | (0x7 << 76) | ((rand >> 68) & 0xFFF) << 64 | (0b10 << 62) | (rand & ((1 << 62) - 1))
    return uuid.UUID(int=value)


def new_notification_id() -> uuid.UUID:
    """Return the id of a new notification (the model's default): a UUIDv7 of now."""
    return uuid7()


def uuid7_time(value: uuid.UUID | str) -> datetime | None:
    """Return the creation time a UUIDv7 carries, or None for another version (ids from before the migration).

    A time past the last a datetime holds (9999-12-31) is read as that last instant (`LATEST`).
    """
    try:
        parsed = value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        return None
    if parsed.version != 7:
        return None
    # Whole milliseconds added to the epoch: exact, where a float timestamp rounds up past LATEST at its end.
    return _UNIX_EPOCH + timedelta(milliseconds=min(parsed.int >> 80, _LATEST_MILLIS))


def notification_range(value: uuid.UUID | str) -> tuple[datetime, datetime] | None:
    """Return the `created_at` range the notification with this id lies in, or None when the id does not say."""
    moment = uuid7_time(value)
    if moment is None:
        return None
    high = LATEST if moment > LATEST - NOTIFICATION_ID_SLACK else moment + NOTIFICATION_ID_SLACK
    return moment - NOTIFICATION_ID_SLACK, high


def day_number(day: date) -> int:
    """Return the number of days from 1970-01-01 to `day`."""
    return (day - EPOCH).days


def delivery_id_day(delivery_id: int) -> date:
    """Return the day a delivery id belongs to (its partition); ids from before the migration give 1970-01-01."""
    return EPOCH + timedelta(days=int(delivery_id) >> DAY_SHIFT)


def delivery_id_bounds(day: date) -> tuple[int, int]:
    """Return the [low, high) delivery-id range of `day`'s partition."""
    n = day_number(day)
    return n << DAY_SHIFT, (n + 1) << DAY_SHIFT


def delivery_ids_of_notification(created_at: datetime) -> tuple[int, int]:
    """Return the [low, high) delivery-id range holding the deliveries of a notification created at `created_at`.

    Deliveries take the day of their notification (the fan-out names it, the accept path is the same
    transaction); around midnight the next day is included.
    """
    first = (created_at - NOTIFICATION_ID_SLACK).astimezone(UTC).date()
    last = (created_at + NOTIFICATION_ID_SLACK).astimezone(UTC).date()
    return delivery_id_bounds(first)[0], delivery_id_bounds(last)[1]


def recent_delivery_ids(days: int | None = None) -> tuple[int, int]:
    """Return the [low, high) delivery ids of the last `days` days (CALLBACK_RECENT_DAYS, 2: today, yesterday)."""
    n = int(getattr(settings, "CALLBACK_RECENT_DAYS", 2)) if days is None else days
    now = timezone.now().astimezone(UTC).date()
    return delivery_id_bounds(now - timedelta(days=max(n, 1) - 1))[0], delivery_id_bounds(now)[1]


def notification_range_of_delivery(delivery_id: int) -> tuple[datetime, datetime] | None:
    """Return the created_at range of the delivery's day, where its notification almost always is.

    None for an id from before the migration, and for one whose day no date holds (past 9999-12-30: no
    delivery has one). A notification accepted in the last moments of a day can have its deliveries in the next
    (their ids take the database's day): a caller that finds nothing looks again without the range.
    """
    if not 0 < int(delivery_id) >> DAY_SHIFT <= _LAST_DAY_NUMBER:
        return None
    start, end = day_bounds(NOTIFICATION, delivery_id_day(delivery_id))
    return start, end - timedelta(microseconds=1)


def day_bounds(table: str, day: date) -> tuple[Any, Any]:
    """Return the [low, high) partition-key bounds of `table` for `day`."""
    if table == NOTIFICATION:
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        return start, start + timedelta(days=1)
    return delivery_id_bounds(day)


def day_filter(table: str, day: date) -> tuple[str, list[Any]]:
    """Return (sql, params): the WHERE predicate selecting exactly `day`'s rows of `table` through its parent.

    For example `SELECT * FROM notifier_delivery WHERE <sql>`; the plan touches only that day's partition.
    """
    low, high = day_bounds(table, day)
    key = KEYS[table]
    return f"{key} >= %s AND {key} < %s", [low, high]


def partition_name(table: str, day: date) -> str:
    """Return the name of `table`'s partition for `day` (`<table>_pYYYYMMDD`)."""
    return f"{table}_p{day:%Y%m%d}"


def _literal(value: Any) -> str:
    if isinstance(value, datetime):
        return f"'{value.isoformat()}'"
    return str(int(value))


# ---- catalog --------------------------------------------------------------------------------------------


def is_partitioned(table: str = DELIVERY) -> bool:
    """Return True when `table` is a partitioned table (the migration has run)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [table])
        row = cursor.fetchone()
    return bool(row) and row[0] == "p"


def _children(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = to_regclass(%s) ORDER BY c.relname",
            [table],
        )
        return [row[0] for row in cursor.fetchall()]


def day_partitions(table: str) -> list[date]:
    """Return the days that have a partition of `table` attached, oldest first."""
    days = []
    for name in _children(table):
        match = _PARTITION_NAME.match(name)
        if match and match["table"] == table:
            days.append(datetime.strptime(match["day"], "%Y%m%d").replace(tzinfo=UTC).date())
    return sorted(days)


# ---- creating ahead -------------------------------------------------------------------------------------


@contextmanager
def _brief_locks(cursor: Any) -> Iterator[None]:
    """Make the DDL inside give up after LOCK_TIMEOUT rather than queue the live traffic behind its lock."""
    if connection.in_atomic_block:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")  # ends with the transaction
        yield
        return
    cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
    try:
        yield
    finally:
        cursor.execute("RESET lock_timeout")


def _per_partition_sql(table: str, name: str) -> list[str]:
    """Return what a new partition needs besides the parent's indexes (which ATTACH creates itself)."""
    if table == DELIVERY:
        # The fan-out's ON CONFLICT DO NOTHING: a notification's deliveries all live in its day, so a unique
        # index per partition keeps a resumed fan-out from doubling (a parent index would need the id in it).
        return [
            f'CREATE UNIQUE INDEX IF NOT EXISTS "{name}_target_uniq"'
            f' ON "{name}" (notification_id, recipient_id, channel, address)'
        ]
    return []


def create_partition(table: str, day: date) -> bool:
    """Create and attach `table`'s partition for `day` unless it exists; return True when it was created.

    The table is built on its own and then attached (SHARE UPDATE EXCLUSIVE on the parent, which inserts
    and updates do not conflict with), instead of CREATE TABLE … PARTITION OF, which locks the parent out.
    """
    with connection.cursor() as cursor:
        if _exists(cursor, partition_name(table, day)):
            return False
        with transaction.atomic():
            with _brief_locks(cursor):
                _create_in_transaction(cursor, table, day)
    return True


def ensure_partitions(*, ahead_days: int | None = None, today: date | None = None) -> list[str]:
    """Create the partitions of today and the next `ahead_days` days of every partitioned table; return the new ones.

    Idempotent; run by the migration and by the maintenance beat task (`notifier.partitions.maintain`).
    """
    ahead = int(getattr(settings, "PARTITIONS_AHEAD_DAYS", 7)) if ahead_days is None else ahead_days
    first = today or timezone.now().astimezone(UTC).date()
    created = []
    for table in (NOTIFICATION, DELIVERY, EVENT):
        if not is_partitioned(table):
            continue
        for offset in range(ahead + 1):
            day = first + timedelta(days=offset)
            if create_partition(table, day):
                created.append(partition_name(table, day))
    if created:
        logger.info("partitions created", extra={"partitions": len(created)})
    return created


# ---- dropping behind ------------------------------------------------------------------------------------


@dataclass
class DropResult:
    """What dropping one day did."""

    day: date
    dropped: list[str] = field(default_factory=list)
    carried: dict[str, int] = field(default_factory=dict)
    lock_seconds: float = 0.0


FINAL_DELIVERY_STATUSES = (
    "sent",
    "delivered",
    "opened",
    "failed",
    "bounced",
    "suppressed",
    "cancelled",
    "digested",
    "skipped",
)
# A notification in one of these still has work of its own (a send time to reach, a fan-out to finish).
NOTIFICATION_WORK_STATUSES = ("scheduled", "fanning_out")


@dataclass(frozen=True)
class Dependent:
    """Rows of an app above this one that hang off deliveries or notifications (dead letters, fan-out lanes).

    Registered by that app at start-up (`register_dependent`): its SQL stays with its tables. A day's drop and
    the retention purge keep a delivery while `keeps_delivery` holds for it (an SQL condition on the delivery
    row `d`), and call the forget functions with the cursor of their transaction once the rows are gone.
    """

    keeps_delivery: str = ""
    # (cursor, low, high): delete the rows whose delivery, with an id in [low, high), no longer exists.
    forget_deliveries: Callable[[Any, int, int], int] | None = None
    # (cursor, dropped table, low, high): delete the rows of the notifications of the dropped table that the
    # parent no longer holds between created_at low and high.
    forget_notifications: Callable[[Any, str, Any, Any], int] | None = None


_dependents: list[Dependent] = []


def register_dependent(dependent: Dependent) -> None:
    """Have drops and purges keep and forget another app's rows that hang off deliveries or notifications."""
    if dependent not in _dependents:
        _dependents.append(dependent)


def kept_delivery_condition() -> str:
    """Return the SQL condition on a delivery row `d` that keeps it for a dependent ("" when none does)."""
    return " OR ".join(f"({d.keeps_delivery})" for d in _dependents if d.keeps_delivery)


def forget_dependents_of_deliveries(cursor: Any, low: int, high: int) -> int:
    """Delete what hung off the deliveries with ids in [low, high) that no longer exist; return how many rows."""
    return sum(d.forget_deliveries(cursor, low, high) for d in _dependents if d.forget_deliveries is not None)


def _selects(day: date, src: dict[str, str], kept_deliveries: str | None) -> dict[str, str]:
    """Return, per table, the SELECT of the rows of `day` (read from `src`) that still have work.

    `kept_deliveries` names a table holding the day's kept deliveries (None: there are none).
    """
    finals = ", ".join(f"'{s}'" for s in FINAL_DELIVERY_STATUSES)
    works = ", ".join(f"'{s}'" for s in NOTIFICATION_WORK_STATUSES)
    _, next_low = delivery_id_bounds(day)
    day_end = day_bounds(NOTIFICATION, day)[1]
    kept = f"SELECT id, notification_id FROM {kept_deliveries} kd" if kept_deliveries else None
    notification = (
        f"SELECT n.* FROM {src[NOTIFICATION]} n WHERE n.status IN ({works})"
        # A single notification accepted in the last moments of the day may have its deliveries in the next
        # one (their ids take the database's day); it waits for them (the next day's drop, then this one).
        f" OR (n.created_at >= '{(day_end - NOTIFICATION_ID_SLACK).isoformat()}' AND EXISTS (SELECT 1 FROM"
        f" notifier_delivery d WHERE d.notification_id = n.id AND d.id >= {next_low}"
        f" AND d.id < {next_low + (1 << DAY_SHIFT)}))"
    )
    if kept:
        notification += f" OR n.id IN (SELECT notification_id FROM ({kept}) k)"
    return {
        DELIVERY: f"SELECT d.* FROM {src[DELIVERY]} d WHERE d.status NOT IN ({finals})"
        + (f" OR {keeps}" if (keeps := kept_delivery_condition()) else ""),
        EVENT: (
            f"SELECT e.* FROM {src[EVENT]} e WHERE e.delivery_id IN (SELECT id FROM ({kept}) k)"
            if kept
            else f"SELECT e.* FROM {src[EVENT]} e WHERE false"
        ),
        NOTIFICATION: notification,
    }


def _sources(names: dict[str, str]) -> dict[str, str]:
    return {t: (f'"{names[t]}"' if t in names else f'(SELECT * FROM "{t}" WHERE false)') for t in TABLES}


def _nothing_to_drop(cursor: Any, day: date, present: dict[str, str]) -> bool:
    """Return True when every row of a carried day's partitions still has work (a re-run would change nothing)."""
    src = _sources(present)
    kept = src[DELIVERY] if DELIVERY in present else None
    selects = _selects(day, src, f"({_selects(day, src, None)[DELIVERY]})" if kept else None)
    for table, name in present.items():
        cursor.execute(f'SELECT (SELECT count(*) FROM "{name}") = (SELECT count(*) FROM ({selects[table]}) s)')
        if not cursor.fetchone()[0]:
            return False
    return True


def _is_carried(cursor: Any, name: str) -> bool:
    cursor.execute("SELECT obj_description(to_regclass(%s), 'pg_class')", [name])
    row = cursor.fetchone()
    return bool(row and row[0] == CARRIED)


CARRIED = "carried: rows of a dropped day that still had work"


def drop_day(day: date, *, archive: Callable[[date], None] | None = None) -> DropResult:
    """Detach and drop `day`'s partitions of the three tables, keeping the rows that still have work.

    1. `archive(day)` runs first, while the day is attached: it reads the day through the parent tables
       (`day_filter`). If it raises, nothing is dropped.
    2. Each partition is detached CONCURRENTLY (outside a transaction; only brief locks on the parent).
    3. Rows that still have work (a delivery not in a final status or kept by a dependent: a pending dead letter; its
       events, and notifications scheduled, fanning out or with a delivery left) are copied into a new,
       small partition attached for the same day, under the same ids: nothing that travels changes.
    4. The detached tables are dropped, with the finished dead letters and fan-out lanes of what went.

    A day already carried is dropped again only once some of its rows have finished; `archive` is then
    called again and sees only what is left of that day.

    Must run outside a transaction (DETACH … CONCURRENTLY cannot run inside one). Returns what it did.
    """
    if connection.in_atomic_block:
        raise RuntimeError("drop_day must run outside a transaction (DETACH PARTITION CONCURRENTLY)")
    result = DropResult(day=day)
    present = {t: partition_name(t, day) for t in TABLES if day in day_partitions(t)}
    if not present:
        return result
    with connection.cursor() as cursor:
        if all(_is_carried(cursor, name) for name in present.values()) and _nothing_to_drop(cursor, day, present):
            return result
    if archive is not None:
        archive(day)
    old = {t: f"{name}_old" for t, name in present.items()}
    with connection.cursor() as cursor:
        for table, name in present.items():
            started = time.monotonic()
            # A run interrupted in the middle of a concurrent detach leaves it pending: finish that one.
            cursor.execute("SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass(%s)", [name])
            pending = cursor.fetchone()
            mode = "FINALIZE" if pending and pending[0] else "CONCURRENTLY"
            with _brief_locks(cursor):
                cursor.execute(f'ALTER TABLE "{table}" DETACH PARTITION "{name}" {mode}')
            result.lock_seconds += time.monotonic() - started
            cursor.execute(f'ALTER TABLE "{name}" RENAME TO "{old[table]}"')
        src = _sources(old)
        kept_name = partition_name(DELIVERY, day)
        kept = _reattach_with(cursor, DELIVERY, day, _selects(day, src, None)[DELIVERY])
        selects = _selects(day, src, f'"{kept_name}"' if kept else None)
        if kept:
            result.carried[DELIVERY] = kept
        for table in (EVENT, NOTIFICATION):
            n = _reattach_with(cursor, table, day, selects[table])
            if n:
                result.carried[table] = n
        # What hung off the dropped rows: finished dead letters (pending ones were carried) and fan-out lanes.
        if DELIVERY in old:
            forget_dependents_of_deliveries(cursor, *delivery_id_bounds(day))
        if NOTIFICATION in old:
            low, high = day_bounds(NOTIFICATION, day)
            for dependent in _dependents:
                if dependent.forget_notifications is not None:
                    dependent.forget_notifications(cursor, old[NOTIFICATION], low, high)
        for table in TABLES:
            if table in old:
                cursor.execute(f'DROP TABLE "{old[table]}"')
                result.dropped.append(present[table])
    logger.info(
        "partition day dropped",
        extra={"day": day.isoformat(), "carried": result.carried, "lock_seconds": round(result.lock_seconds, 3)},
    )
    return result


def _reattach_with(cursor: Any, table: str, day: date, select: str) -> int:
    """Attach a new partition of `table` for `day` holding the rows of `select`; return how many (0: none made).

    An empty day is not re-made: nothing new is written to a day this old, except deliveries of a carried
    notification (a scheduled fan-out), and the carried notification's day keeps its delivery partition then.
    """
    name = partition_name(table, day)
    low, high = day_bounds(table, day)
    key = KEYS[table]
    with transaction.atomic():
        cursor.execute(f'CREATE TABLE "{name}" (LIKE "{table}" INCLUDING DEFAULTS INCLUDING STORAGE)')
        cursor.execute(f'INSERT INTO "{name}" {select}')
        rows = cursor.rowcount
        if not rows:
            cursor.execute(f'DROP TABLE "{name}"')
            return 0
        cursor.execute(
            f'ALTER TABLE "{name}" ADD CONSTRAINT "{name}_range"'
            f" CHECK ({key} IS NOT NULL AND {key} >= {_literal(low)} AND {key} < {_literal(high)})"
        )
        for sql in _per_partition_sql(table, name):
            cursor.execute(sql)
        with _brief_locks(cursor):
            cursor.execute(
                f'ALTER TABLE "{table}" ATTACH PARTITION "{name}"'
                f" FOR VALUES FROM ({_literal(low)}) TO ({_literal(high)})"
            )
        cursor.execute(f'ALTER TABLE "{name}" DROP CONSTRAINT "{name}_range"')
        cursor.execute(f"COMMENT ON TABLE \"{name}\" IS '{CARRIED}'")
    return rows


def days_to_drop(*, today: date | None = None) -> list[date]:
    """Return the days older than the hot window (DELIVERY_HOT_DAYS) that still have partitions, oldest first."""
    first = today or timezone.now().astimezone(UTC).date()
    cutoff = first - timedelta(days=hot_days() - 1)
    days: set[date] = set()
    for table in TABLES:
        days.update(d for d in day_partitions(table) if d < cutoff)
    return sorted(days)


def drop_old_days(*, archive: Callable[[date], None] | None = None, today: date | None = None) -> list[DropResult]:
    """Drop every day older than the hot window (see `drop_day`); return what each drop did."""
    days = days_to_drop(today=today)
    results = []
    with progress.task("drop old day partitions", total=len(days), unit="days") as work:
        for day in days:
            results.append(drop_day(day, archive=archive))
            work.advance()
    return results


def archive_hook() -> Callable[[date], None] | None:
    """Return the callable PARTITION_ARCHIVE_HOOK names ("module.function"), or None when it is empty."""
    path = str(getattr(settings, "PARTITION_ARCHIVE_HOOK", "") or "")
    if not path:
        return None
    return import_string(path)


@shared_task(name=task_names.PARTITIONS_MAINTAIN, ignore_result=True)
def maintain() -> dict[str, Any]:
    """Create the coming days' partitions, archive and drop the days past DELIVERY_HOT_DAYS, purge old dedup keys."""
    created = ensure_partitions()
    dropped = [r.day.isoformat() for r in drop_old_days(archive=archive_hook()) if r.dropped]
    purged = dedup.purge_expired()
    return {"created": len(created), "dropped_days": dropped, "dedup_keys_purged": purged}


# ---- the migration from single tables -------------------------------------------------------------------


# The parents' indexes: the models' indexes (their names as Django gives them), minus the unique ones a
# partitioned table cannot hold without its key.
_PARENT_INDEXES = {
    NOTIFICATION: [
        "CREATE INDEX notification_user_idx ON ONLY notifier_notification (user_id, created_at DESC)",
        "CREATE INDEX notification_client_idx ON ONLY notifier_notification (client_id, created_at DESC)",
        "CREATE INDEX notification_created_brin ON ONLY notifier_notification USING brin (created_at)",
        "CREATE INDEX notifier_notification_campaign_id_6369ac5d ON ONLY notifier_notification (campaign_id)",
        "CREATE INDEX notifier_notification_client_id_3bd9d5ae ON ONLY notifier_notification (client_id)",
        "CREATE INDEX notifier_notification_recipient_id_a4c54388 ON ONLY notifier_notification (recipient_id)",
        "CREATE INDEX notifier_notification_topic_id_8cc4a27a ON ONLY notifier_notification (topic_id)",
        # Support's search by dedup key, of any age (the key table holds only the window's keys).
        "CREATE INDEX notification_dedup_idx ON ONLY notifier_notification (client_id, dedup_key)"
        " WHERE dedup_key IS NOT NULL",
    ],
    DELIVERY: [
        "CREATE INDEX delivery_outbox_idx ON ONLY notifier_delivery (published_at) WHERE status = 'queued'",
        "CREATE INDEX delivery_inflight_idx ON ONLY notifier_delivery (claimed_at) WHERE status = 'sending'",
        "CREATE INDEX delivery_due_idx ON ONLY notifier_delivery (not_before)"
        " WHERE status IN ('deferred', 'scheduled')",
        "CREATE INDEX delivery_provider_msg_idx ON ONLY notifier_delivery (provider, provider_message_id)"
        " WHERE NOT provider_message_id = ''",
        "CREATE INDEX delivery_inbox_idx ON ONLY notifier_delivery (recipient_id, id DESC) WHERE channel = 'inapp'",
        "CREATE INDEX delivery_recipient_idx ON ONLY notifier_delivery (recipient_id, created_at DESC)",
        "CREATE INDEX delivery_created_brin ON ONLY notifier_delivery USING brin (created_at)",
        "CREATE INDEX delivery_template_version_idx ON ONLY notifier_delivery (template_version_id)"
        " WHERE template_version_id IS NOT NULL",
        "CREATE INDEX delivery_pending_idx ON ONLY notifier_delivery (not_before) WHERE status = 'pending'",
        "CREATE INDEX delivery_address_hash ON ONLY notifier_delivery USING hash (address) WHERE NOT address = ''",
        "CREATE INDEX delivery_resent_from_idx ON ONLY notifier_delivery (resent_from_id)"
        " WHERE resent_from_id IS NOT NULL",
    ],
    EVENT: [
        "CREATE INDEX notifier_deliveryevent_delivery_id_618dff5b ON ONLY notifier_deliveryevent (delivery_id)",
        "CREATE INDEX event_at_brin ON ONLY notifier_deliveryevent USING brin (at)",
    ],
}

DELIVERY_ID_FUNCTION = f"""
CREATE OR REPLACE FUNCTION notifier_delivery_id(at timestamptz) RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT (floor(extract(epoch FROM at) / 86400)::bigint << {DAY_SHIFT})
           | (nextval('notifier_delivery_seq') & {SEQUENCE_MASK})
$$
"""


def _exists(cursor: Any, name: str) -> bool:
    cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
    return bool(cursor.fetchone()[0])


def _create_in_transaction(cursor: Any, table: str, day: date) -> None:
    name = partition_name(table, day)
    low, high = day_bounds(table, day)
    cursor.execute(f'CREATE TABLE "{name}" (LIKE "{table}" INCLUDING DEFAULTS INCLUDING STORAGE)')
    for sql in _per_partition_sql(table, name):
        cursor.execute(sql)
    cursor.execute(
        f'ALTER TABLE "{table}" ATTACH PARTITION "{name}" FOR VALUES FROM ({_literal(low)}) TO ({_literal(high)})'
    )


def partition_new_tables(cursor: Any) -> None:
    """Replace the three hot tables, just created empty by the initial migration, with parents partitioned by day.

    Each parent keeps its table's columns and defaults; it gets the indexes of _PARENT_INDEXES, its primary key
    (notifications: with `created_at`, the partition key), the id sequences and the partitions of today and
    PARTITIONS_AHEAD_DAYS more.
    """
    for table in (NOTIFICATION, DELIVERY, EVENT):
        plain = f"{table}_plain"
        cursor.execute(f'ALTER TABLE "{table}" RENAME TO "{plain}"')
        cursor.execute(
            f'CREATE TABLE "{table}" (LIKE "{plain}" INCLUDING DEFAULTS INCLUDING STORAGE)'
            f" PARTITION BY RANGE ({KEYS[table]})"
        )
        cursor.execute(f'DROP TABLE "{plain}"')
        if table == DELIVERY:
            cursor.execute("CREATE SEQUENCE notifier_delivery_seq")
            cursor.execute(DELIVERY_ID_FUNCTION)
            cursor.execute("ALTER TABLE notifier_delivery ALTER COLUMN id SET DEFAULT notifier_delivery_id(now())")
            cursor.execute("ALTER TABLE notifier_delivery ADD CONSTRAINT notifier_delivery_pkey PRIMARY KEY (id)")
        elif table == EVENT:
            cursor.execute("CREATE SEQUENCE notifier_deliveryevent_seq")
            cursor.execute(
                "ALTER TABLE notifier_deliveryevent ALTER COLUMN id SET DEFAULT nextval('notifier_deliveryevent_seq')"
            )
        else:
            cursor.execute(
                "ALTER TABLE notifier_notification"
                " ADD CONSTRAINT notifier_notification_pkey PRIMARY KEY (id, created_at)"
            )
        for sql in _PARENT_INDEXES[table]:
            cursor.execute(sql)
    today = timezone.now().astimezone(UTC).date()
    for table in (NOTIFICATION, DELIVERY, EVENT):
        for offset in range(int(getattr(settings, "PARTITIONS_AHEAD_DAYS", 7)) + 1):
            _create_in_transaction(cursor, table, today + timedelta(days=offset))
