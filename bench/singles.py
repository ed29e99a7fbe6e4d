"""Single notifications as a calling service sends them: 16 concurrent HTTP clients against gunicorn.

    BENCH_NS=me .venv/bin/python bench/singles.py [--singles 3000] [--clients 16] [--batches 10] [--batch-callers 4]

The API runs as the Procfile runs it (gunicorn, 2 workers x 16 threads), the send worker as `worker_high`
(threads x 8) with the sandbox provider. Prints: accepted requests/s with p50/p99 latency; accept -> `sent`
deliveries/s (first accept to last sent_at, as the database recorded them); the empty-Celery-task rate beside
it; CPU seconds per component during the run; and the batch endpoint's notifications/s (1,000 items a call),
from one caller and from several at once.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ApiServer,
    Worker,
    add_history_options,
    api_key,
    cleanup,
    empty_task_rate,
    log,
    make_template,
    parser,
    percentile,
    prepare,
    process_tree_cpu,
    service_cpu_seconds,
    wait_until,
    workers,
)


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--singles", type=int, default=3000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--batches", type=int, default=10, help="calls of 1,000 items to the batch endpoint")
    p.add_argument("--batch-callers", type=int, default=4, help="callers at once in the second batch run")
    p.add_argument("--port", type=int, default=int(os.environ.get("BENCH_PORT", "0")), help="default: a free one")
    add_history_options(p)
    args = p.parse_args()
    prepare(history_days=args.history_days, history_per_day=args.history_per_day)
    try:
        noop = empty_task_rate()
        log(f"empty task: publish+consume {noop['end_to_end_per_s']:.0f}/s")
        run(args, noop)
    finally:
        cleanup(args.keep)


def run(args: Any, noop: dict[str, float]) -> None:
    from django.db.models import Max, Min

    from notifier.deliveries.models import Delivery
    from notifier.deliveries.outbox import relay
    from preferences.models import Recipient

    make_template("otp", "security")
    key = api_key()
    n = args.singles
    Recipient.objects.bulk_create(
        [Recipient(user_id=f"s-{i}", email=f"s-{i}@example.com") for i in range(n + 2 * args.batches * 1000)],
        batch_size=5000,
    )
    send = Worker("singles-high", ["email.high"], concurrency=8, pool="threads")
    server = ApiServer(port=args.port)
    args.port = server.port
    latencies: list[float] = []
    errors: list[str] = []
    try:
        server.wait_ready()
        with workers(send):
            cpu0 = {"api (gunicorn)": process_tree_cpu(server.proc.pid), "send worker": send.cpu_seconds()}
            cpu0 |= service_cpu_seconds()
            counter = iter(range(n))
            lock = threading.Lock()
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

            def client() -> None:
                conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=30)
                while True:
                    with lock:
                        i = next(counter, None)
                    if i is None:
                        conn.close()
                        return
                    body = {"recipient": {"user_id": f"s-{i}"}, "category": "security", "template": "otp"}
                    body |= {"channels": ["email"], "payload": {"n": i}}
                    started = time.perf_counter()
                    conn.request("POST", "/api/v1/notifications", json.dumps(body), headers)
                    response = conn.getresponse()
                    response.read()
                    elapsed = time.perf_counter() - started
                    with lock:
                        latencies.append(elapsed)
                        if response.status != 202:
                            errors.append(str(response.status))

            threads = [threading.Thread(target=client) for _ in range(args.clients)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            accept_wall = time.monotonic() - t0
            qs = Delivery.objects.filter(notification__template_key="otp")
            # `make run` has beat run the outbox relay every 15 s; a benchmark with no beat would wait forever for
            # a single whose publish failed (the relay is the safety net of the coalescing publisher).
            relayed = {"unpublished": 0, "stale": 0, "lost": 0, "at": time.monotonic()}

            def all_sent() -> bool:
                if time.monotonic() - relayed["at"] >= 15:
                    for name, count in relay().items():
                        if name in relayed:
                            relayed[name] += count
                    relayed["at"] = time.monotonic()
                return qs.filter(status="sent").count() >= n

            wait_until(all_sent, timeout=600, interval=1, what="singles sent")
            span = qs.aggregate(a=Min("notification__created_at"), b=Max("sent_at"))
            cpu1 = {"api (gunicorn)": process_tree_cpu(server.proc.pid), "send worker": send.cpu_seconds()}
            cpu1 |= service_cpu_seconds()
            to_sent = (span["b"] - span["a"]).total_seconds()
            ms = [x * 1000 for x in latencies]
            print("\n=== bench/singles.py (shared 2-core box) ===")
            print(f"single accepts            {n / accept_wall:.0f} req/s with {args.clients} clients")
            print(f"  latency                 p50 {percentile(ms, 50):.0f} ms, p99 {percentile(ms, 99):.0f} ms")
            print(f"  non-202 answers         {len(errors)}")
            print(f"accept -> sent            {n / to_sent:.0f} deliveries/s ({n} singles in {to_sent:.1f} s)")
            print(f"  relay (every 15 s)      {relayed['unpublished']} never published (the fast path missed them),")
            print(f"                          {relayed['stale'] + relayed['lost']} published but not claimed in time")
            print(f"empty Celery task         {noop['end_to_end_per_s']:.0f}/s publish+consume (one-message ceiling)")
            print(f"CPU seconds during the singles run ({to_sent:.1f} s wall, 2 cores = {2 * to_sent:.0f} CPU-s):")
            for name, before in cpu0.items():
                print(f"  {name:<18} {cpu1[name] - before:6.1f} s")
            for callers, first in ((1, n), (args.batch_callers, n + args.batches * 1000)):
                batch_rate, batch_errors = batch_accepts(args, key, callers=callers, first=first)
                print(
                    f"batch accept              {batch_rate:.0f} notifications/s ({args.batches} calls of 1,000 items,"
                    f" {callers} caller{'s' if callers > 1 else ''} at once)"
                )
                if batch_errors:
                    print(f"  errors                  {batch_errors}")
    finally:
        server.stop()


def batch_accepts(args: Any, key: str, *, callers: int, first: int) -> tuple[float, list[str]]:
    """POST the batch endpoint `args.batches` times (1,000 new items each) from `callers` threads at once.

    Return notifications/s and the errors. Items are numbered from `first`, so every call's are new.
    """
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    accepted = [0] * callers
    errors: list[str] = []

    def caller(c: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=120)
        for b in range(c, args.batches, callers):
            items = [
                {
                    "recipient": {"user_id": f"s-{first + b * 1000 + i}"},
                    "category": "security",
                    "template": "otp",
                    "channels": ["email"],
                    "payload": {"n": i},
                }
                for i in range(1000)
            ]
            conn.request("POST", "/api/v1/notifications/batch", json.dumps({"notifications": items}), headers)
            response = conn.getresponse()
            answer = response.read()
            if response.status != 200:
                errors.append(f"HTTP {response.status}: {answer[:200]!r}")
                continue
            accepted[c] += sum(1 for r in json.loads(answer)["results"] if r.get("status") == 202)
        conn.close()

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(callers)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(accepted) / (time.monotonic() - started), errors


if __name__ == "__main__":
    main()
