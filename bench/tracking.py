"""The click-tracking redirect (/t/c/<token>) under the API's gunicorn: requests per second, latency, rows written.

    BENCH_NS=me .venv/bin/python bench/tracking.py [--requests 4000] [--clients 8]

The redirect reads no database row (the signed token carries the delivery id and the URL) and writes one event
row per click, for a delivery the log holds. This migrates the bench database, starts the API as the Procfile
runs it (gunicorn.conf.py) on a free loopback port, accepts 500 emails over the batch endpoint (no worker sends
them: a click counts whatever the delivery's status), mints a signed link for each delivery in this process with
the same SECRET_KEY, and fires GETs from several client threads over keep-alive connections. It prints
requests/s, p50, p99 and max, the answers by status and the click events written (one per 302).
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    DB_NAME,
    ApiServer,
    add_recipients,
    api_key,
    cleanup,
    in_parallel,
    key_environment,
    log,
    make_template,
    parser,
    percentile,
    prepare,
)

LINKS = 500


def main() -> None:
    """Run the benchmark and print its figures."""
    p = parser(__doc__ or "")
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--clients", type=int, default=8)
    args = p.parse_args()
    prepare()
    server: ApiServer | None = None
    try:
        from notifier.tracking.services import click_url

        server = ApiServer().wait_ready()
        paths = ["/t/c/" + click_url(delivery_id, f"https://shop.example.com/item/{n}?utm=bench").rsplit("/t/c/", 1)[1]
                 for n, delivery_id in enumerate(_deliveries(server.port))]  # fmt: skip
        log(f"the API on {server.url}; {args.requests} clicks from {args.clients} clients")

        def click(conn: http.client.HTTPConnection, i: int) -> tuple[int, float]:
            started = time.perf_counter()
            try:
                conn.request("GET", paths[i % len(paths)])
                response = conn.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                conn.close()
                status = 0
            return status, time.perf_counter() - started

        in_parallel("127.0.0.1", server.port, args.clients, 200, click)  # warm-up
        before = _clicks()
        started = time.perf_counter()
        results = in_parallel("127.0.0.1", server.port, args.clients, args.requests, click)
        seconds = time.perf_counter() - started
        written = _clicks() - before
        ms = sorted(took * 1000 for _, took in results)
        answers = Counter(status for status, _ in results)
        print("\n=== bench/tracking.py ===")
        rate = len(results) / seconds
        print(f"redirects     {len(results)} in {seconds:.2f} s from {args.clients} clients: {rate:.0f}/s")
        print(f"latency       p50 {percentile(ms, 50):.1f} ms  p99 {percentile(ms, 99):.1f} ms  max {ms[-1]:.1f} ms")
        print(f"answers       {dict(sorted(answers.items()))}")
        print(f"click events  {written} written (one per 302: {written == answers[302]})")
    finally:
        if server is not None:
            server.stop()
        cleanup(args.keep)


def _deliveries(port: int) -> list[int]:
    """Accept LINKS emails, one a recipient, over the batch endpoint; return their delivery ids."""
    key = api_key()
    add_recipients(DB_NAME, "tk", LINKS, environment_id=key_environment(DB_NAME, key))
    make_template("tk_news", "marketing")
    items = [{"recipient": {"user_id": f"tk{n}"}, "template": "tk_news", "channels": ["email"]} for n in range(LINKS)]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    connection.request("POST", "/api/v1/notifications/batch", json.dumps({"notifications": items}), headers)
    answer = json.loads(connection.getresponse().read())
    connection.close()
    ids = [d["id"] for result in answer["results"] for d in result.get("deliveries", [])]
    if len(ids) != LINKS:
        raise RuntimeError(f"accepted {len(ids)} deliveries of {LINKS}: {str(answer)[:500]}")
    return ids


def _clicks() -> int:
    """Return how many click events the bench database holds."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM notifier_deliveryevent WHERE status = 'clicked'")
        return int(cursor.fetchone()[0])


if __name__ == "__main__":
    main()
