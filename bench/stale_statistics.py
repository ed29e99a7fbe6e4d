"""The send path's statements over lists of ids when the statistics predate the rows, then after ANALYZE.

    BENCH_NS=me .venv/bin/python bench/stale_statistics.py [--ids 20000] [--sent 200] [--keys 20000]

Today's delivery partition is analyzed while it holds --sent sent deliveries, then --ids queued ones arrive
(the first minute of a day, a campaign's burst into a table analyzed when everything was sent). For 2, 1,000
and --ids of them, prints the wall time of the publisher's mark, the claim and the send batch's load, each
run in a transaction that is rolled back, best of three. Then the batch's dedup lookup of 1,000 keys, with
--keys keys of the client where the statistics saw 10. Then all of it again after ANALYZE. No broker, no
workers: the statements only, on the bench database.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# A database of its own beside the other benchmarks of this namespace.
os.environ["BENCH_NS"] = os.environ.get("BENCH_NS", "") + "_stale"

from bench._common import cleanup, fill_day, log, parser, prepare


def _best_ms(sql: str, params: list[Any] | dict[str, Any], *, runs: int = 3) -> float:
    """Return the fastest of `runs` executions of `sql`, each in a transaction rolled back, in ms."""
    from django.db import connection

    best = float("inf")
    for _ in range(runs):
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            started = time.perf_counter()
            cursor.execute(sql, params)
            best = min(best, (time.perf_counter() - started) * 1000)
            cursor.execute("ROLLBACK")
    return best


def _queued_after_analyze(sent: int, queued: int) -> list[int]:
    """Fill today's partition with `sent` sent deliveries, analyze it, add `queued` queued ones; return theirs."""
    from django.db import connection
    from django.utils import timezone

    from notifier.deliveries.models import Delivery
    from notifier.deliveries.partitions import DELIVERY, partition_name

    day = timezone.now().astimezone(UTC).date()
    fill_day(day, sent, created=timezone.now(), analyze=False)
    names = [str(f.column) for f in Delivery._meta.concrete_fields]
    columns = ", ".join(names)
    # Copies of the first delivery, ids past the filled ones; the address keeps each (notification, recipient,
    # channel, address) unique.
    values = ", ".join(
        "d.id + 1000000 + g" if name == "id"
        else "d.address || '-' || g" if name == "address"
        else "'queued'" if name == "status"
        else "NULL" if name == "published_at"
        else f"d.{name}"
        for name in names
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(f'ANALYZE "{partition_name(DELIVERY, day)}"')
        cursor.execute(
            f"INSERT INTO notifier_delivery ({columns}) SELECT {values} FROM notifier_delivery d"
            " CROSS JOIN generate_series(1, %s) g WHERE d.id = (SELECT min(id) FROM notifier_delivery) RETURNING id",
            [queued],
        )
        return sorted(row[0] for row in cursor.fetchall())


def _keys(client_id: int, first: int, n: int) -> None:
    from django.db import connection
    from django.utils import timezone

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO notifier_dedupkey (client_id, dedup_key, notification_id, request_hash, created_at)"
            " SELECT %s, 'k-' || g, gen_random_uuid(), 'h', %s FROM generate_series(%s, %s) g",
            [client_id, timezone.now(), first, first + n - 1],
        )


def _measure(ids: list[int], client_id: int, keys: int, when: str) -> None:
    from core.db import int_array, texts_param
    from notifier.deliveries.dedup import _LOOKUP_SQL, _cutoff
    from notifier.deliveries.outbox import MARK_STILL_QUEUED_SQL
    from notifier.deliveries.queries import _LOAD_SQL
    from notifier.deliveries.status import _CLAIM_SQL

    print(f"\n=== {when} ===")
    print(f"{'ids':>8} {'mark':>10} {'claim':>10} {'load':>10}   (ms, best of 3)")
    for n in sorted({2, 1000, len(ids)}):
        part = ids[-n:]
        low, high, array = min(part), max(part), int_array(part)
        mark = _best_ms(MARK_STILL_QUEUED_SQL, [array, low, high, low, high])
        claim = _best_ms(_CLAIM_SQL, {"ids": array, "low": low, "high": high, "lease": 60})
        load = _best_ms(_LOAD_SQL, [array, low, high])
        print(f"{n:>8} {mark:>10.1f} {claim:>10.1f} {load:>10.1f}")
    wanted = [f"k-{i}" for i in range(keys - 999, keys + 1)]
    lookup = _best_ms(_LOOKUP_SQL, [texts_param(wanted), client_id, _cutoff()])
    print(f"dedup lookup of 1,000 keys among {keys:,} of the client: {lookup:.1f} ms")


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--ids", type=int, default=20_000, help="queued deliveries the statistics have not seen")
    p.add_argument("--sent", type=int, default=200, help="sent deliveries the partition held when analyzed")
    p.add_argument("--keys", type=int, default=20_000, help="dedup keys of the client the statistics have not seen")
    args = p.parse_args()
    prepare(broker=False)
    from django.db import connection

    from notifier.clients.services import api_client_create

    try:
        ids = _queued_after_analyze(args.sent, args.ids)
        client = api_client_create(name=f"stale-{time.time_ns()}")[0]
        _keys(client.pk, 1, 10)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE notifier_dedupkey")
        _keys(client.pk, 11, args.keys - 10)
        log(f"{len(ids):,} queued deliveries and {args.keys:,} dedup keys the statistics have not seen")
        _measure(ids, client.pk, args.keys, f"statistics from {args.sent} sent deliveries and 10 keys")
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE notifier_delivery, notifier_dedupkey")
        _measure(ids, client.pk, args.keys, "after ANALYZE")
    finally:
        cleanup(args.keep, broker=False)


if __name__ == "__main__":
    main()
