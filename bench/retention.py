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

import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import HOT_TABLES, cleanup, fill_day, log, mib, parser, prepare


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

    from notifier.deliveries.partitions import partition_name

    out = {}
    with connection.cursor() as cursor:
        for table in HOT_TABLES:
            cursor.execute("SELECT coalesce(pg_total_relation_size(to_regclass(%s)), 0)", [partition_name(table, day)])
            out[table] = int(cursor.fetchone()[0])
    return out


def dead_tuples(day: date) -> int:
    from django.db import connection

    from notifier.deliveries.partitions import partition_name

    with connection.cursor() as cursor:
        # This backend's counts reach the shared statistics on the next flush; read them fresh.
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT 1")
        time.sleep(1.5)
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [[partition_name(t, day) for t in HOT_TABLES]],
        )
        return int(cursor.fetchone()[0])


def run_delete(day: date, n: int, batch: int) -> dict[str, Any]:
    """Fill `day`, then remove its deliveries with the batched DELETE; return the figures."""
    from ops.retention import retention_purge

    log(f"filling {day} with {n:,} deliveries for the batched DELETE")
    filled = fill_day(day, n, created=datetime.now(tz=UTC) - timedelta(days=40))
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
    from notifier.deliveries.partitions import drop_day

    log(f"filling {day} with {n:,} deliveries for the partition drop")
    filled = fill_day(day, n, created=datetime.now(tz=UTC))
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
    prepare(broker=False)
    from django.utils import timezone

    today = timezone.now().astimezone(UTC).date()
    try:
        delete = run_delete(today + timedelta(days=2), args.deliveries, args.batch)
        log(f"  DELETE done: {delete['rows']:,} deliveries, {delete['events']:,} events in {delete['batches']} batches")
        drop = run_drop(today + timedelta(days=3), args.deliveries)
        log(f"  drop done: {', '.join(drop['dropped'])}")
    finally:
        cleanup(args.keep, broker=False)
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
