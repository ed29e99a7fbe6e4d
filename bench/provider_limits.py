"""Hammer the shared rate limiter from several processes and compare the achieved rate with the configured one.

    .venv/bin/python bench/provider_limits.py --rate 200 --burst 50 --reserve 0.2 \
        --high-procs 1 --low-procs 3 --seconds 10 [--batch 20] [--high-interval 0.01]

Each process takes tokens for one fake provider through `core.ratelimit` (real Redis, under a
throw-away key prefix) as fast as it is granted them, sleeping the returned wait when refused. High-priority
processes ask every `--high-interval` seconds (a steady OTP stream); low ones saturate. The report prints
the granted totals per priority against `burst + rate * seconds`, the most the bucket allows.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEVELOPMENT", "true")  # a local benchmark: the built-in SECRET_KEY is fine
PROVIDER = "bench"


def _setup(prefix: str, conf: dict[str, Any]) -> None:
    import django
    from django.conf import settings

    django.setup()
    settings.REDIS_KEY_PREFIX = prefix
    settings.PROVIDER_RATE_LIMITS = {PROVIDER: conf}


def _worker(prefix: str, conf: dict[str, Any], priority: str, args: argparse.Namespace, ready: Any, out: Any) -> None:
    _setup(prefix, conf)
    from core.ratelimit import RateLimiter

    limiter = RateLimiter()
    limiter.snapshot(PROVIDER)  # connect and load nothing yet, so the first timed call is a normal one
    # Start together once every process is set up: a late starter would leave the bucket full, wasting tokens.
    ready.wait()
    end = time.time() + args.seconds
    granted = calls = 0
    while time.time() < end:
        calls += 1
        n = 1 if priority == "high" else args.batch
        grant = limiter.acquire(PROVIDER, n, priority=priority)
        granted += grant.granted
        if priority == "high":
            time.sleep(args.high_interval)
        elif grant.granted < n:
            time.sleep(min(grant.wait, 0.05))
    out.put((priority, granted, calls, grant.degraded))


def main() -> None:
    """Run the benchmark and print the report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--burst", type=float, default=50.0)
    parser.add_argument("--reserve", type=float, default=0.2, help="high_reserve fraction of the burst")
    parser.add_argument("--high-procs", type=int, default=1)
    parser.add_argument("--low-procs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=20, help="tokens asked per low-priority call")
    parser.add_argument("--high-interval", type=float, default=0.01, help="seconds between high-priority asks")
    args = parser.parse_args()

    prefix = f"notifier-bench:{uuid.uuid4().hex[:8]}:"
    conf = {"rate": args.rate, "burst": args.burst, "high_reserve": args.reserve}
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    priorities = ["high"] * args.high_procs + ["low"] * args.low_procs
    ready = ctx.Barrier(len(priorities))
    procs = [ctx.Process(target=_worker, args=(prefix, conf, p, args, ready, out)) for p in priorities]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=args.seconds + 60) for _ in procs]
    for proc in procs:
        proc.join()

    _setup(prefix, conf)
    from core.redis_guard import get_redis

    client = get_redis()
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)

    totals: dict[str, list[int]] = {"high": [0, 0], "low": [0, 0]}
    degraded = any(r[3] for r in results)
    for priority, granted, calls, _ in results:
        totals[priority][0] += granted
        totals[priority][1] += calls
    allowed = args.burst + args.rate * args.seconds
    overall = totals["high"][0] + totals["low"][0]
    print(f"configured: rate {args.rate:g}/s, burst {args.burst:g}, high reserve {args.reserve:.0%}")
    mode = " (DEGRADED: Redis unreachable, per-process limits)" if degraded else ""
    print(f"processes: {args.high_procs} high, {args.low_procs} low, {args.seconds:g} s{mode}")
    print(f"{'':8}{'granted':>10}{'rate/s':>10}{'calls':>10}")
    for priority in ("high", "low"):
        granted, calls = totals[priority]
        print(f"{priority:8}{granted:>10}{granted / args.seconds:>10.1f}{calls:>10}")
    print(f"{'overall':8}{overall:>10}{overall / args.seconds:>10.1f}")
    print(f"bucket allows at most {allowed:.0f} ({args.rate:g}/s + burst); achieved {overall / allowed:.1%} of it")
    high_asked = totals["high"][1]
    if high_asked:
        print(f"high priority: {totals['high'][0]} of {high_asked} asks granted ({totals['high'][0] / high_asked:.1%})")


if __name__ == "__main__":
    main()
