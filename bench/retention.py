"""Retention of one day: today's batched DELETE against detaching and dropping the day's partitions.

    BENCH_NS=me .venv/bin/python bench/retention.py [--deliveries 2000000] [--batch 5000] [--keep]

One day of N finished deliveries (two events each, one notification per two deliveries) is written with
generate_series into one day's partitions, twice: the first copy is removed by `retention.retention_purge`
(the batched DELETE the project ran before partitioning; its rows are backdated past the cut-off), the second
by `partitions.drop_day` (DETACH … CONCURRENTLY, then DROP). For each: wall time, the time the parent tables
were locked (for the drop: the detaches; for the DELETE: every batch holds row locks, so its whole time),
WAL bytes written (pg_current_wal_lsn before and after) and the size the tables keep afterwards (a DELETE
leaves dead tuples until VACUUM; a drop returns the files). No broker is used; the bench database
`bench_notifier_<BENCH_NS>` is created from scratch and dropped at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import DB_NAME, ENV, ROOT, _psql, log, parser

# A UUIDv7 for row k of the day: the day's noon in milliseconds, version 7, variant 10, then md5 bits.
_UUID7 = (
    "(lpad(to_hex(%(ms)s::bigint), 12, '0') || '7' || substr(md5(({k})::text), 1, 3) || '8'"
    " || substr(md5(({k})::text), 4, 15))::uuid"
)

FILL_NOTIFICATIONS = """
INSERT INTO notifier_notification (id, client_id, request_hash, category, template_key, channels, payload,
    recipient_id, user_id, priority, locale, send_at_local, strategy, fallback_until, status, fanout_processed,
    trace_id, created_at, updated_at)
SELECT {uuid}, %(client)s, 'h', 'transactional', 'welcome', '{{email,sms}}', '{{}}', %(recipient)s, 'u-bench',
       'normal', '', '', 'all', '', 'done', 0, '', %(born)s, %(born)s
FROM generate_series(1, %(notifications)s) k
"""

# One address per delivery, as real traffic has: the hash index on address degrades badly on a repeated value.
FILL_DELIVERIES = """
INSERT INTO notifier_delivery (id, notification_id, recipient_id, channel, priority, address, status, reason,
    provider, provider_message_id, pinned_provider, attempts, last_error, sms_encoding, created_at, updated_at,
    sent_at)
SELECT %(low)s + g, {uuid}, %(recipient)s, CASE WHEN g %% 2 = 0 THEN 'sms' ELSE 'email' END, 'normal',
       CASE WHEN g %% 2 = 0 THEN '+1555' || lpad(g::text, 7, '0') ELSE 'b' || g || '@example.com' END,
       'delivered', '', 'sandbox',
       'm-' || g, '', 1, '', '', %(created)s, %(created)s, %(created)s
FROM generate_series(1, %(deliveries)s) g
"""

FILL_EVENTS = """
INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at)
SELECT %(low)s + g, s, '', %(created)s FROM generate_series(1, %(deliveries)s) g, unnest(ARRAY['queued', 'sent']) s
"""

TABLES = ("notifier_notification", "notifier_delivery", "notifier_deliveryevent")


def prepare_database() -> None:
    """Create the bench database from scratch and migrate it (no broker needed here)."""
    os.environ.update(ENV)
    _psql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    _psql(f"CREATE DATABASE {DB_NAME}")
    log(f"migrating {DB_NAME}")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env={**os.environ}, check=True)
    import django

    django.setup()


def fill(day: date, deliveries: int, *, created: datetime) -> float:
    """Write one day of deliveries (ids of `day`), their events and notifications; return the seconds it took."""
    from django.db import connection

    from notifier.models import ApiClient
    from notifier.partitions import delivery_id_bounds
    from preferences.models import Recipient

    client, _ = ApiClient.objects.get_or_create(name="bench", defaults={"key_prefix": "bench", "key_hash": "b" * 64})
    recipient, _ = Recipient.objects.get_or_create(user_id="u-bench", defaults={"email": "bench@example.com"})
    born = datetime.combine(day, datetime.min.time(), tzinfo=UTC) + timedelta(hours=12)
    params: dict[str, int | datetime] = {
        "ms": int(born.timestamp() * 1000),
        "client": client.pk,
        "recipient": recipient.pk,
        "born": born,
        "notifications": (deliveries + 1) // 2,
        "deliveries": deliveries,
        "low": delivery_id_bounds(day)[0],
        "created": created,
    }
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(FILL_NOTIFICATIONS.format(uuid=_UUID7.format(k="k")), params)
        cursor.execute(FILL_DELIVERIES.format(uuid=_UUID7.format(k="(g + 1) / 2")), params)
        cursor.execute(FILL_EVENTS, params)
        cursor.execute("ANALYZE notifier_delivery; ANALYZE notifier_deliveryevent; ANALYZE notifier_notification")
    return time.monotonic() - started


def wal_lsn() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()")
        return cursor.fetchone()[0]


def wal_bytes(since: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [since])
        return int(cursor.fetchone()[0])


def sizes(day: date) -> dict[str, int]:
    """Return the total size (heap, indexes, TOAST) of each of the day's partitions, 0 when it is gone."""
    from django.db import connection

    from notifier.partitions import partition_name

    out = {}
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute("SELECT coalesce(pg_total_relation_size(to_regclass(%s)), 0)", [partition_name(table, day)])
            out[table] = int(cursor.fetchone()[0])
    return out


def dead_tuples(day: date) -> int:
    from django.db import connection

    from notifier.partitions import partition_name

    with connection.cursor() as cursor:
        # This backend's counts reach the shared statistics on the next flush; read them fresh.
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT 1")
        time.sleep(1.5)
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [[partition_name(t, day) for t in TABLES]],
        )
        return int(cursor.fetchone()[0])


def mib(n: float) -> str:
    return f"{n / 1024 / 1024:,.1f} MiB"


def run_delete(day: date, n: int, batch: int) -> dict[str, Any]:
    """Fill `day`, then remove its deliveries with the batched DELETE; return the figures."""
    from ops.retention import retention_purge

    log(f"filling {day} with {n:,} deliveries for the batched DELETE")
    filled = fill(day, n, created=datetime.now(tz=UTC) - timedelta(days=40))
    before = sizes(day)
    log(f"  filled in {filled:.0f} s; the day's tables: {mib(sum(before.values()))}")
    lsn = wal_lsn()
    cpu, started = time.process_time(), time.monotonic()
    result = retention_purge(older_than_days=30, batch=batch)
    seconds = time.monotonic() - started
    return {
        "seconds": seconds,
        "locked_seconds": seconds,
        "client_cpu": time.process_time() - cpu,
        "wal": wal_bytes(lsn),
        "before": sum(before.values()),
        "after": sum(sizes(day).values()),
        "dead": dead_tuples(day),
        "rows": result["deliveries"],
        "events": result["events"],
        "batches": result["batches"],
    }


def run_drop(day: date, n: int) -> dict[str, Any]:
    """Fill `day`, then detach and drop its partitions; return the figures."""
    from notifier.partitions import drop_day

    log(f"filling {day} with {n:,} deliveries for the partition drop")
    filled = fill(day, n, created=datetime.now(tz=UTC))
    before = sizes(day)
    log(f"  filled in {filled:.0f} s; the day's tables: {mib(sum(before.values()))}")
    lsn = wal_lsn()
    cpu, started = time.process_time(), time.monotonic()
    result = drop_day(day)
    seconds = time.monotonic() - started
    return {
        "seconds": seconds,
        "locked_seconds": result.lock_seconds,
        "client_cpu": time.process_time() - cpu,
        "wal": wal_bytes(lsn),
        "before": sum(before.values()),
        "after": sum(sizes(day).values()),
        "dead": 0,
        "rows": n,
        "dropped": result.dropped,
    }


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--deliveries", type=int, default=2_000_000)
    p.add_argument("--batch", type=int, default=5000, help="RETENTION_BATCH of the DELETE run")
    args = p.parse_args()
    prepare_database()
    from django.utils import timezone

    today = timezone.now().astimezone(UTC).date()
    try:
        delete = run_delete(today + timedelta(days=2), args.deliveries, args.batch)
        log(f"  DELETE done: {delete['rows']:,} deliveries, {delete['events']:,} events in {delete['batches']} batches")
        drop = run_drop(today + timedelta(days=3), args.deliveries)
        log(f"  drop done: {', '.join(drop['dropped'])}")
    finally:
        if not args.keep:
            from django.db import connections

            connections.close_all()
            _psql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    n = args.deliveries
    print()
    print(f"Retention of one day: {n:,} deliveries, {2 * n:,} events, {(n + 1) // 2:,} notifications")
    print(f"{'':28}{'batched DELETE':>18}{'detach + drop':>18}")
    rows = [
        ("wall time", lambda r: f"{r['seconds']:.2f} s"),
        ("time holding locks", lambda r: f"{r['locked_seconds']:.3f} s"),
        ("client CPU", lambda r: f"{r['client_cpu']:.2f} s"),
        ("WAL written", lambda r: mib(r["wal"])),
        ("day's tables before", lambda r: mib(r["before"])),
        ("day's tables after", lambda r: mib(r["after"])),
        ("dead tuples left", lambda r: f"{r['dead']:,}"),
    ]
    for label, fmt in rows:
        print(f"{label:28}{fmt(delete):>18}{fmt(drop):>18}")
    print(
        "\nThe DELETE holds row locks batch after batch for its whole run and leaves the space to VACUUM; the drop"
        " holds the parents only during the concurrent detaches (their brief ShareUpdateExclusive phases)."
    )


if __name__ == "__main__":
    main()
