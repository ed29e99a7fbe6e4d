"""Singles against the stack as `make run` ships it, from outside: only its HTTP API and its database are used.

    API_CLIENT_RATE_LIMIT=5000/s make run          # in one shell (the default 200/s per client caps one caller)
    .venv/bin/python bench/make_run.py [--singles 4000] [--clients 16] [--url http://127.0.0.1:8000]

The other benchmarks start their own API and workers with DEBUG off and WARNING logs; this one measures what
a newcomer runs: gunicorn, every worker, beat, Flower and the inbox streams under honcho, INFO logs, DEBUG
on. With the demo API key (var/demo-api-key) it creates --singles recipients with an email address, sends
each one email single from --clients concurrent HTTP clients, and prints the accepts per second with their
latency, the time from the first accept to the last delivery recorded `sent` (polling the database), the CPU
seconds of each process group on the box in that time, and then the time until every notification also reads
`sent` over the API (GET /api/v1/notifications/{id}, which makes load of its own).
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, group_cpu, log, percentile, print_cpu


class Api:
    """A keep-alive HTTP client per thread for the running API, with the demo key."""

    def __init__(self, url: str, key: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def in_parallel(self, clients: int, n: int, call: Callable[[http.client.HTTPConnection, int], Any]) -> list[Any]:
        """Run `call(connection, i)` for i in range(n) from `clients` threads; return the results in order."""
        results: list[Any] = [None] * n

        def work(c: int) -> None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            for i in range(c, n, clients):
                results[i] = call(conn, i)
            conn.close()

        threads = [threading.Thread(target=work, args=(c,)) for c in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results

    def request(self, conn: http.client.HTTPConnection, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Send one request; wait and retry while the API answers 429; return the status and the parsed body."""
        while True:
            conn.request(method, path, None if body is None else json.dumps(body), self.headers)
            response = conn.getresponse()
            data = response.read()
            if response.status != 429:
                return response.status, json.loads(data) if data else None
            time.sleep(float(response.getheader("Retry-After") or 1))


def sent_count(prefix: str) -> int:
    """Return how many deliveries to this run's recipients the database records as sent."""
    sql = (
        "SELECT count(*) FROM notifier_delivery d JOIN notifier_notification n ON n.id = d.notification_id"
        f" WHERE n.user_id LIKE '{prefix}%' AND d.status = 'sent'"  # the prefix is ours, no caller's text
    )
    found = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "notifier", "-Atc", sql],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(found.stdout.strip() or 0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--singles", type=int, default=4000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    key_file = ROOT / "var" / "demo-api-key"
    if not key_file.exists():
        sys.exit("no var/demo-api-key: start the stack with `make run` first")
    api = Api(args.url, key_file.read_text().strip())
    n, prefix = args.singles, f"mr{int(time.time())}-"

    log(f"creating {n} recipients")
    api.in_parallel(
        args.clients,
        n,
        lambda conn, i: api.request(conn, "PUT", f"/api/v1/recipients/{prefix}{i}", {"email": f"r{i}@example.com"}),
    )

    def send(conn: http.client.HTTPConnection, i: int) -> tuple[int, float, str]:
        body = {"recipient": {"user_id": f"{prefix}{i}"}, "template": "order_shipped", "channels": ["email"]}
        body["payload"] = {"order_id": f"B-{i}"}
        started = time.monotonic()
        status, answer = api.request(conn, "POST", "/api/v1/notifications", body)
        return status, (time.monotonic() - started) * 1000, (answer or {}).get("id", "")

    log(f"sending {n} singles from {args.clients} clients")
    cpu0, t0 = group_cpu(), time.monotonic()
    results = api.in_parallel(args.clients, n, send)
    accept_wall = time.monotonic() - t0
    deadline = t0 + args.timeout
    while sent_count(prefix) < n and time.monotonic() < deadline:
        time.sleep(0.5)
    cpu1, to_sent = group_cpu(), time.monotonic() - t0
    ids = [r[2] for r in results]

    def reads_sent(conn: http.client.HTTPConnection, i: int) -> bool:
        status, answer = api.request(conn, "GET", f"/api/v1/notifications/{ids[i]}")
        return status == 200 and bool(answer["deliveries"]) and all(d["status"] == "sent" for d in answer["deliveries"])

    while not all(api.in_parallel(args.clients, n, reads_sent)) and time.monotonic() < deadline:
        time.sleep(1)
    to_read = time.monotonic() - t0

    latencies = [r[1] for r in results]
    print(f"\n=== bench/make_run.py: the stack as `make run` ships it ({args.url}) ===")
    print(f"single accepts            {n / accept_wall:.0f} req/s with {args.clients} clients")
    print(f"  latency                 p50 {percentile(latencies, 50):.0f} ms, p99 {percentile(latencies, 99):.0f} ms")
    print(f"  non-202 answers         {sum(1 for r in results if r[0] != 202)}")
    print(f"accept -> sent            {n / to_sent:.0f} deliveries/s ({n} singles in {to_sent:.1f} s, database polled)")
    print(f"every one read sent       {to_read:.1f} s after the first accept (GET /api/v1/notifications/{{id}})")
    print(f"CPU seconds from the first accept to the last sent ({to_sent:.1f} s wall, 2 cores = {2 * to_sent:.0f}):")
    print_cpu(cpu0, cpu1, n)


if __name__ == "__main__":
    main()
