"""Where a send batch's CPU goes: one sandbox batch of deliveries run in-process, Python and PostgreSQL side.

    BENCH_NS=me .venv/bin/python bench/send_profile.py [--batch 500] [--batches 6] [--cprofile 25]

No broker and no workers: a topic-shaped notification and its queued email deliveries are written with SQL,
then `channels_app.services.deliver` runs on batches of them in this process (the first batch warms the
caches and is not counted). Prints, per 1,000 deliveries: this process's CPU, the CPU of its PostgreSQL
backend (read from /proc through psutil: pg_stat_statements is not loaded on this server), and every
statement the batch ran (count, wall ms, grouped by its first words), then the top of a cProfile.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# A database of its own beside the other benchmarks of this namespace (they may run at the same time).
os.environ["BENCH_NS"] = os.environ.get("BENCH_NS", "") + "_profile"

from bench._common import StatementCounter, cleanup, log, make_template, make_topic, parser, prepare


def _deliveries(n: int) -> list[int]:
    """Write a topic notification and n queued email deliveries as the fan-out would; return their ids."""
    from django.db import connection

    from notifier.clients.services import api_client_create
    from notifier.deliveries.models import Notification
    from preferences.models import Topic

    client = api_client_create(name=f"profile-{time.time_ns()}")[0]
    n_obj = Notification.objects.create(
        client=client,
        category="social",
        template_key="news",
        template_version=1,
        channels=["email"],
        payload={"n": 1},
        topic=Topic.objects.get(key="all"),
        priority="low",
        status="fanning_out",
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO notifier_delivery (notification_id, recipient_id, channel, priority, address, status,"
            " reason, provider, provider_message_id, pinned_provider, attempts, last_error, published_at,"
            " sms_encoding, sms_segments, created_at, updated_at)"
            " SELECT %s, id, 'email', 'low', email, 'queued', '', '', '', '', 0, '', now(), '', 0, now(), now()"
            " FROM preferences_recipient ORDER BY id LIMIT %s RETURNING id",
            [n_obj.pk, n],
        )
        return sorted(row[0] for row in cursor.fetchall())


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--batches", type=int, default=6, help="batches measured (after one warm-up batch)")
    p.add_argument("--cprofile", type=int, default=25, help="cProfile lines to print (0: no cProfile)")
    args = p.parse_args()
    prepare(broker=False)
    try:
        run(args)
    finally:
        cleanup(args.keep, broker=False)


def run(args: Any) -> None:
    import psutil
    from django.db import connection

    from channels_app.services import deliver

    make_template("news", "social")
    make_topic("all", args.batch * (args.batches + 1))
    ids = _deliveries(args.batch * (args.batches + 1))
    batches = [ids[i : i + args.batch] for i in range(0, len(ids), args.batch)]
    deliver(batches[0])  # warm-up: template, connection, caches
    statements = StatementCounter().install()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = psutil.Process(cursor.fetchone()[0])
    statements.clear()
    profiler = cProfile.Profile()
    py0, pg0, wall0 = time.process_time(), sum(backend.cpu_times()[:2]), time.perf_counter()
    sent = 0
    for batch in batches[1:]:
        if args.cprofile:
            profiler.enable()
        report = deliver(batch)
        profiler.disable()
        sent += report.sent
    py1, pg1, wall1 = time.process_time(), sum(backend.cpu_times()[:2]), time.perf_counter()
    n = sent or 1
    per_k = 1000 / n
    print(f"\n=== bench/send_profile.py: {args.batches} batches of {args.batch} sandbox email deliveries ===")
    print(f"sent                       {sent}")
    print(f"wall                       {(wall1 - wall0) * 1000 * per_k:7.0f} ms per 1,000 deliveries")
    print(f"worker CPU (this process)  {(py1 - py0) * 1000 * per_k:7.0f} ms per 1,000 deliveries")
    print(f"PostgreSQL backend CPU     {(pg1 - pg0) * 1000 * per_k:7.0f} ms per 1,000 deliveries")
    print(f"statements per batch of {args.batch}, wall ms per 1,000 deliveries (client side, includes the server):")
    statements.report(per=args.batches, ms_scale=per_k)
    if args.cprofile:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(args.cprofile)
        print(out.getvalue())
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.cprofile)
        print(out.getvalue())
    log("done")


if __name__ == "__main__":
    main()
