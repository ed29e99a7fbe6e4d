"""Archive export: rows per second and bytes per million deliveries, for one day of the delivery log.

Fills the bench database (BENCH_NS gives it its own name; no broker needed) with one UTC day of N deliveries
(default 1,000,000), their notifications (two deliveries each) and events (two per delivery), written by
generate_series with realistic shapes: four channels, a status mix, provider message ids, some errors, 1%
of recipients erased. Then exports the day with notifier.deliveries.archive to moto's S3 server on 127.0.0.1 and
prints the rate and the sizes.

    BENCH_NS=archive .venv/bin/python bench/archive.py [--deliveries 1000000] [--restore] [--keep]

CPU is reported per side (the exporting thread; the PostgreSQL backend that served the cursor) because the
wall clock on a shared machine says more about the neighbours than about the export.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import cleanup, log, parser, prepare

DAY = dt.date(2026, 11, 20)


def fill(deliveries: int) -> None:
    """Write one day of notifications, deliveries and events with generate_series."""
    from django.db import connection

    from notifier.clients.services import api_client_create

    client_id = api_client_create(name="bench-archive")[0].pk
    notifications = max(1, deliveries // 2)
    recipients = max(1, min(100_000, deliveries // 10))
    start = f"'{DAY.isoformat()} 00:00:00+00'::timestamptz"
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO preferences_recipient (id, user_id, email, phone, locale, timezone, webhook_url, opted_out,"
            " channel_prefs, category_prefs, created_at, updated_at, erased_at)"
            " SELECT g, 'user-' || g, 'user' || g || '@example.com', '+4915' || lpad(g::text, 9, '0'), 'de', '',"
            " '', false, '{}', '{}', now(), now(), CASE WHEN g %% 100 = 0 THEN now() END"
            " FROM generate_series(1, %s) g",
            [recipients],
        )
        log(f"{recipients} recipients")
        # Notification n: created at an even spread over the day, to recipient n % recipients + 1.
        cursor.execute(
            "INSERT INTO notifier_notification (id, client_id, request_hash, category, template_key, channels,"
            " payload, recipient_id, user_id, priority, locale, status, fanout_processed, trace_id, created_at,"
            " updated_at) SELECT md5('n' || g)::uuid, %s, md5(g::text), 'transactional', 'order_shipped',"
            " '{email,push}', jsonb_build_object('order', g), g %% %s + 1, 'user-' || (g %% %s + 1), 'normal', 'de',"
            f" 'done', 0, substr(md5('t' || g), 1, 32), {start} + g * (interval '86399 seconds' / %s),"
            f" {start} + g * (interval '86399 seconds' / %s) + interval '5 seconds'"
            " FROM generate_series(1, %s) g",
            [client_id, recipients, recipients, notifications, notifications, notifications],
        )
        log(f"{notifications} notifications")
        cursor.execute(
            "INSERT INTO notifier_delivery (notification_id, recipient_id, channel, priority, address, status,"
            " reason, provider, provider_message_id, attempts, last_error, published_at, claimed_at, sent_at,"
            " read_at, sms_segments, created_at, updated_at)"
            " SELECT md5('n' || (g / 2 + 1))::uuid, (g / 2 + 1) %% %s + 1, c.channel, 'normal',"
            " CASE c.channel WHEN 'email' THEN 'user' || g || '@example.com' WHEN 'sms' THEN '+4915' || g"
            "  ELSE 'fcm:' || md5(g::text) || md5((g + 1)::text) END,"
            " CASE WHEN g %% 50 = 0 THEN 'failed' WHEN g %% 7 = 0 THEN 'delivered' ELSE 'sent' END,"
            " CASE WHEN g %% 50 = 0 THEN 'provider_rejected' ELSE '' END,"
            " CASE c.channel WHEN 'email' THEN 'ses' WHEN 'sms' THEN 'twilio' ELSE 'fcm' END,"
            " 'msg-' || md5(g::text), 1,"
            " CASE WHEN g %% 50 = 0 THEN 'InvalidParameter: user' || g || '@example.com rejected' ELSE '' END,"
            " t.at, t.at + interval '40 ms', t.at + interval '300 ms', NULL,"
            " CASE WHEN c.channel = 'sms' THEN 1 END, t.at, t.at + interval '2 seconds'"
            " FROM generate_series(0, %s - 1) g"
            " CROSS JOIN LATERAL (SELECT (ARRAY['email','push','sms','inapp'])[g %% 4 + 1] AS channel) c"
            f" CROSS JOIN LATERAL (SELECT {start} + (g / 2 + 1) * (interval '86399 seconds' / %s) AS at) t",
            [recipients, deliveries, notifications],
        )
        log(f"{deliveries} deliveries")
        cursor.execute(
            "INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at)"
            " SELECT d.id, s.status, '', d.created_at + s.after FROM notifier_delivery d"
            " CROSS JOIN (VALUES ('sending', interval '40 ms'), ('sent', interval '300 ms')) s(status, after)"
        )
        log(f"{cursor.rowcount} events")
        cursor.execute("ANALYZE")


def main() -> None:
    """Fill, export, print the figures."""
    args = parser(__doc__.splitlines()[0])
    args.add_argument("--deliveries", type=int, default=1_000_000)
    args.add_argument("--batch-rows", type=int, default=100_000)
    args.add_argument("--restore", action="store_true", help="also restore the day and time it")
    opts = args.parse_args()

    import os

    from tests.stubs import aws
    from tests.stubs.aws import MotoServer

    moto = MotoServer().start()
    os.environ.update(
        ARCHIVE_BUCKET="bench-archive",
        ARCHIVE_S3_ENDPOINT_URL=moto.url,
        ARCHIVE_S3_REGION=aws.REGION,
        ARCHIVE_AWS_ACCESS_KEY_ID=aws.ACCESS_KEY,
        ARCHIVE_AWS_SECRET_ACCESS_KEY=aws.SECRET_KEY,
        ARCHIVE_BATCH_ROWS=str(opts.batch_rows),
        ARCHIVE_UPLOAD_PART_BYTES=str(8 * 1024 * 1024),
    )
    prepare(broker=False)
    try:
        from django.db import connection

        from notifier.deliveries import archive

        started = time.monotonic()
        fill(opts.deliveries)
        log(f"filled in {time.monotonic() - started:.0f} s")
        storage = archive.Storage.from_settings()
        storage.client.create_bucket(Bucket="bench-archive")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = psutil.Process(cursor.fetchone()[0])
        backend_cpu = sum(backend.cpu_times()[:2])
        thread_cpu = time.thread_time()
        wall = time.monotonic()
        manifest = archive.archive_day(DAY, storage=storage)
        wall = time.monotonic() - wall
        thread_cpu = time.thread_time() - thread_cpu
        backend_cpu = sum(backend.cpu_times()[:2]) - backend_cpu
        tables = manifest["tables"]
        rows = sum(t["rows"] for t in tables.values())
        total = sum(t["bytes"] for t in tables.values())
        per_million = 1_000_000 / max(1, tables["delivery"]["rows"])
        print("\n=== bench/archive.py ===")
        for name, table in tables.items():
            print(f"{name:<16} {table['rows']:>10,} rows {table['bytes']:>13,} bytes {len(table['files'])} file(s)")
        print(f"rows/s (wall)               {rows / wall:,.0f}   ({rows:,} rows in {wall:.1f} s)")
        print(
            f"rows per CPU-second, export {rows / max(thread_cpu, 1e-9):,.0f}   (exporting thread {thread_cpu:.1f} s)"
        )
        print(f"PostgreSQL backend CPU      {backend_cpu:.1f} s")
        print(f"bytes per million deliveries, all three tables  {total * per_million / 1e6:,.1f} MB")
        print(
            f"bytes per million deliveries, deliveries only   {tables['delivery']['bytes'] * per_million / 1e6:,.1f} MB"
        )
        if opts.restore:
            wall = time.monotonic()
            thread_cpu = time.thread_time()
            loaded = archive.restore_day(DAY, storage=storage)
            wall = time.monotonic() - wall
            thread_cpu = time.thread_time() - thread_cpu
            restored = sum(loaded.values())
            print(f"restore rows/s (wall)       {restored / wall:,.0f}   ({restored:,} rows in {wall:.1f} s)")
            print(f"restore rows per CPU-second {restored / max(thread_cpu, 1e-9):,.0f}   (restoring thread)")
            archive.restore_drop(DAY)
    finally:
        cleanup(opts.keep, broker=False)
        moto.stop()


if __name__ == "__main__":
    main()
