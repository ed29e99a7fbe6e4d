"""Benchmark the click-tracking redirect (/t/c/<token>) under gunicorn: requests per second and latency.

The redirect reads no database row (the signed token carries the delivery id and the URL) and writes one
event row per click. This starts gunicorn on a loopback port against the database in DATABASE_URL (migrated
first), mints signed tokens in this process with the same SECRET_KEY, and fires GETs from several client
threads over keep-alive connections. It prints requests/s, p50, p99 and max, and how many answered 302.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/notifier_smart .venv/bin/python bench/tracking.py --port 8107
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SECRET = "bench-tracking-secret"


def main() -> None:
    """Run the benchmark and print its figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8107)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=4)
    args = p.parse_args()
    env = {
        **os.environ,
        "SECRET_KEY": SECRET,
        "DEBUG": "false",
        "LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)

    import django

    django.setup()
    from notifier.tracking.services import click_url

    tokens = [
        "/t/c/" + click_url(i + 1, f"https://shop.example.com/item/{i}?utm=bench").rsplit("/t/c/", 1)[1]
        for i in range(500)
    ]
    server = subprocess.Popen(
        [
            sys.executable, "-m", "gunicorn", "config.wsgi:application", "-b", f"127.0.0.1:{args.port}",
            "-w", str(args.workers), "--threads", str(args.threads), "--access-logfile", "/dev/null",
        ],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_up(args.port)
        _run(args, tokens[:50], warmup=True)
        latencies, codes, seconds = _run(args, tokens, warmup=False)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
    latencies.sort()
    print(f"redirects: {len(latencies)} in {seconds:.2f}s with {args.clients} client threads")
    print(f"gunicorn: {args.workers} workers x {args.threads} threads on 127.0.0.1:{args.port}")
    print(f"requests/s: {len(latencies) / seconds:.0f}")
    p50, p99 = statistics.median(latencies), latencies[int(len(latencies) * 0.99) - 1]
    print(f"latency ms: p50 {p50 * 1000:.1f}  p99 {p99 * 1000:.1f}  max {latencies[-1] * 1000:.1f}")
    print(f"answers: {dict(sorted(codes.items()))}")


def _wait_up(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("gunicorn did not come up")


def _run(args: argparse.Namespace, tokens: list[str], *, warmup: bool) -> tuple[list[float], dict[int, int], float]:
    total = 200 if warmup else args.requests
    per_client = total // args.clients
    latencies: list[float] = []
    codes: dict[int, int] = {}
    lock = threading.Lock()

    def client(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=10)
        mine: list[float] = []
        seen: dict[int, int] = {}
        for i in range(per_client):
            path = tokens[(n * per_client + i) % len(tokens)]
            started = time.perf_counter()
            try:
                conn.request("GET", path)
                response = conn.getresponse()
                response.read()
                status = response.status
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=10)
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=10)
                status = 0
            mine.append(time.perf_counter() - started)
            seen[status] = seen.get(status, 0) + 1
        with lock:
            latencies.extend(mine)
            for status, count in seen.items():
                codes[status] = codes.get(status, 0) + count

    threads = [threading.Thread(target=client, args=(n,)) for n in range(args.clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, codes, time.perf_counter() - started


if __name__ == "__main__":
    main()
