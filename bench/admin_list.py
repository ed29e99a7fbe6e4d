"""The delivery admin's list pages with two weeks of history: time per page and the SQL behind it.

    BENCH_NS=me .venv/bin/python bench/admin_list.py [--days 14] [--per-day 1430000] [--runs 5] [--keep]
    BENCH_NS=me .venv/bin/python bench/admin_list.py --reuse        # measure again on the kept database

`--days` days of deliveries (today and the days before it, `--per-day` each: 14 x 1.43 M = 20 M) are written
with generate_series straight into their day partitions (deliveries only: the list pages read no other hot
table), spread over each day (today's up to now), with a mix of channels, providers, priorities and statuses
(1 in 1,000 failed, 1 in 500 bounced), each partition VACUUM ANALYZEd as a fortnight of autovacuum would have.
Then each list page a support person opens is fetched through Django's test client as a superuser, `--runs`
times: the default page, other date ranges, filters, a search, a page further on. For each: median and
slowest wall time, the number of SQL statements, and the slowest statement. For comparison within the run,
the statements the page used to run are timed on the same data: `COUNT(*)` over every partition (Django's
paginator) and `SELECT DISTINCT` of channel, provider and priority (the filters' choices).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import _UUID7, ENV, cleanup, log, mib, parser, prepare, table_sizes

_FILL = """
INSERT INTO notifier_delivery (id, notification_id, recipient_id, channel, priority, address, status, reason,
    provider, provider_message_id, pinned_provider, attempts, last_error, sms_encoding, created_at, updated_at,
    sent_at)
SELECT %(low)s + g, {uuid}, 1 + g %% 100000,
       (ARRAY['email', 'sms', 'push', 'inapp', 'webhook'])[g %% 5 + 1],
       CASE WHEN g %% 10 = 0 THEN 'high' ELSE 'low' END,
       'a' || %(tag)s || '-' || g || '@example.com',
       CASE WHEN g %% 1000 = 0 THEN 'failed' WHEN g %% 500 = 0 THEN 'bounced' WHEN g %% 3 = 0 THEN 'sent'
            ELSE 'delivered' END,
       '', (ARRAY['ses', 'twilio', 'fcm', 'sandbox', 'webhook'])[g %% 5 + 1], 'm-' || %(tag)s || '-' || g, '', 1,
       '', '', t.at, t.at, t.at
FROM generate_series(1, %(n)s) g, LATERAL (SELECT %(start)s + g::bigint * %(step)s * interval '1 microsecond' AS at) t
"""


def _setup_django() -> None:
    os.environ.update(ENV)
    import django

    django.setup()


def load(days: int, per_day: int) -> None:
    """Write `days` days of `per_day` deliveries each (today back) into their day partitions."""
    from django.db import connection
    from django.utils import timezone

    from notifier.deliveries import partitions

    now = timezone.now()
    today = now.astimezone(UTC).date()
    started = time.monotonic()
    for back in range(days - 1, -1, -1):
        day = today - timedelta(days=back)
        partitions.create_partition(partitions.DELIVERY, day)
        start = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
        span = (now - start) if back == 0 else timedelta(days=1)
        born = start + timedelta(hours=12)
        params: dict[str, Any] = {
            "low": partitions.delivery_id_bounds(day)[0],
            "n": per_day,
            "tag": day.strftime("%Y%m%d"),
            "start": start,
            "step": int(span / timedelta(microseconds=1)) // (per_day + 1),
            "ms": int(born.timestamp() * 1000),
        }
        t0 = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute(_FILL.format(uuid=_UUID7.format(k="g / 5")), params)
            t1 = time.monotonic()
            cursor.execute(f'VACUUM (ANALYZE) "{partitions.partition_name(partitions.DELIVERY, day)}"')
        log(f"  {day}: {per_day:,} deliveries in {t1 - t0:.0f} s, vacuumed in {time.monotonic() - t1:.0f} s")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notifier_delivery")
    total = days * per_day
    log(f"loaded {total:,} deliveries in {time.monotonic() - started:.0f} s; {mib(table_sizes()['notifier_delivery'])}")


def _timed(sql: str) -> float:
    from django.db import connection

    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(sql)
        cursor.fetchall()
    return (time.monotonic() - started) * 1000


def measure(runs: int) -> None:
    """Fetch each list page `runs` times and print its figures, then the old page's statements."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from notifier.deliveries.models import Delivery

    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    today = timezone.now().astimezone(UTC).date()
    old_day = today - timedelta(days=10)
    old = Delivery.objects.filter(pk__gte=_low(old_day)).order_by("pk").values_list("address", flat=True).first()
    base = "/admin/deliveries/delivery/"
    client.get(base)  # warm up: the session, the templates compiled, the connection opened
    pages = [
        ("default (today and yesterday)", base),
        ("page 5 of the default", base + "?p=5"),
        ("last 7 days", base + "?range=7d"),
        ("last 14 days", base + "?range=14d"),
        ("any date", base + "?range=all"),
        (f"one old day ({old_day})", base + f"?day={old_day.isoformat()}"),
        ("status failed (rare), default range", base + "?status__exact=failed"),
        ("status bounced, any date", base + "?status__exact=bounced&range=all"),
        ("channel sms + provider twilio", base + "?channel=sms&provider=twilio"),
        ("search an old address, any date", base + f"?q={old}&range=all"),
        ("search an old address, default range", base + f"?q={old}"),
    ]
    log(f"list pages, {runs} runs each (wall time through the test client: view, SQL and template):")
    log(f"  {'page':<40} {'median':>8} {'max':>8} {'in SQL':>8} {'rows':>5} {'SQL':>4}  slowest statement")
    for name, url in pages:
        times, sql_times, queries = [], [], None
        for _ in range(runs):
            with CaptureQueriesContext(connection) as ctx:
                started = time.monotonic()
                response = client.get(url)
                times.append((time.monotonic() - started) * 1000)
            assert response.status_code == 200, (url, response.status_code)
            queries = ctx.captured_queries
            sql_times.append(sum(float(q["time"]) for q in queries) * 1000)
        assert queries is not None
        slowest = max(queries, key=lambda q: float(q["time"]))
        shown = response.content.decode().count('name="_selected_action"')  # the rows' checkboxes
        log(
            f"  {name:<40} {statistics.median(times):>6.0f}ms {max(times):>6.0f}ms"
            f" {statistics.median(sql_times):>6.0f}ms {shown:>5} {len(queries):>4}"
            f"  {float(slowest['time']) * 1000:.0f} ms: {slowest['sql'][:90]}"
        )
    log("what the page ran before, on the same data (each statement once):")
    log(f"  COUNT(*) over every partition: {_timed('SELECT count(*) FROM notifier_delivery'):,.0f} ms")
    for column in ("channel", "provider", "priority"):
        sql = f"SELECT DISTINCT {column} FROM notifier_delivery ORDER BY {column}"
        log(f"  SELECT DISTINCT {column} (the filter's choices): {_timed(sql):,.0f} ms")


def _low(day: date) -> int:
    from notifier.deliveries.partitions import delivery_id_bounds

    return delivery_id_bounds(day)[0]


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--days", type=int, default=14)
    p.add_argument("--per-day", type=int, default=1_430_000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--reuse", action="store_true", help="measure on the kept bench database, loading nothing")
    p.add_argument("--load-only", action="store_true", help="load and keep the database, measure nothing")
    args = p.parse_args()
    os.environ.setdefault("ALLOWED_HOSTS", "testserver")
    if args.reuse:
        _setup_django()
        measure(args.runs)
        return
    prepare(broker=False)
    try:
        log(f"loading {args.days} days x {args.per_day:,} deliveries")
        load(args.days, args.per_day)
        if not args.load_only:
            measure(args.runs)
    finally:
        cleanup(args.keep or args.load_only, broker=False)


if __name__ == "__main__":
    main()
