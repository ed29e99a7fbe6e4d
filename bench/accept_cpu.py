"""CPU of one single accept in-process: POST /api/v1/notifications through Django's test client, no HTTP server.

    BENCH_NS=me .venv/bin/python bench/accept_cpu.py [--accepts 1000] [--quota] [--wsgi]

`--wsgi` calls the WSGI application gunicorn serves (config/wsgi.py: the API's own middleware chain) instead of
the test client (which runs every middleware on every path).

Measures the request thread's own CPU (`time.thread_time`, so the background publisher's thread is not
counted), the statements each accept runs and their wall time, against a database of its own. No broker is
set up: the publish after commit fails fast and leaves the rows to the relay, as with a broker outage, which
is outside what this measures. `--quota` gives the key's environment a daily email quota it never reaches, so
each accept also checks and counts it on Redis (projects.quotas): the difference is what quotas cost. Also printed:
the garbage collector's collections during the measured accepts and the time they took (`gc.callbacks`);
`--gc-young N` sets the young generation's threshold (Python's default 700) to see what another costs.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["BENCH_NS"] = os.environ.get("BENCH_NS", "") + "_accept"

from bench._common import StatementCounter, api_key, cleanup, log, make_template, parser, percentile, prepare

# Recipients the singles are addressed to, in turn (a batch's items each have their own).
SINGLE_RECIPIENTS = 200
# A batch's items cycle through this many calls' worth of recipients: the set-up does not grow with --accepts.
BATCH_POOL_CALLS = 60


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--accepts", type=int, default=1000)
    p.add_argument("--cprofile", type=int, default=0, help="cProfile lines to print (0: none)")
    p.add_argument("--batch", type=int, default=0, help="items per call to the batch endpoint instead (0: singles)")
    p.add_argument("--profile-out", default="", help="also save the cProfile stats to this file (pstats format)")
    p.add_argument("--dedup", action="store_true", help="every item its own dedup_key (as bench/floor.py sends)")
    p.add_argument("--quota", action="store_true", help="a daily email quota on the key's environment (never reached)")
    p.add_argument("--gc-young", type=int, default=0, help="the collector's young-generation threshold (0: Python's)")
    p.add_argument(
        "--wsgi",
        action="store_true",
        help="call config.wsgi's application as gunicorn does (its middleware chains), not the test client",
    )
    args = p.parse_args()
    prepare(broker=False)
    try:
        run(args)
    finally:
        cleanup(args.keep, broker=False)


def run(args: Any) -> None:
    from django.test import Client

    from preferences.models import Recipient

    make_template("otp", "security")
    key = api_key()
    if args.quota:
        from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID, Environment

        environment = Environment.objects.get(pk=DEFAULT_LIVE_ENVIRONMENT_ID)
        environment.quotas = {"email": 10**9}
        environment.save()
    n = args.accepts
    # Singles cycle through a fixed set of recipients, so the set-up does not grow with --accepts: the difference
    # between two runs (the instruction counts under callgrind) is the accepts' alone, not also recipients created.
    pool = BATCH_POOL_CALLS * args.batch if args.batch else SINGLE_RECIPIENTS
    Recipient.objects.bulk_create(
        [Recipient(user_id=f"a-{i}", email=f"a-{i}@example.com") for i in range(pool)], batch_size=5000
    )
    client = WsgiClient(key) if args.wsgi else Client(HTTP_AUTHORIZATION=f"Bearer {key}")

    def item(i: int) -> dict[str, Any]:
        body = {
            "recipient": {"user_id": f"a-{i % pool}"},
            "category": "security",
            "template": "otp",
            "channels": ["email"],
        }
        return body | {"dedup_key": f"k-{i}"} if args.dedup else body

    def accept(i: int) -> int:
        body: Any = item(i) | {"payload": {"n": i}}
        path = "/api/v1/notifications"
        if args.batch:
            body = {"notifications": [item(i * args.batch + j) | {"payload": {"n": j}} for j in range(args.batch)]}
            path += "/batch"
        response = client.post(path, json.dumps(body), content_type="application/json")
        if args.batch and response.status_code == 200:
            return max(r["status"] for r in response.json()["results"])
        return response.status_code

    for i in range(50):  # warm-up: imports, connection, caches
        assert accept(n + i) == 202
    statements = StatementCounter().install()
    cpu: list[float] = []
    profiler = None
    if args.cprofile:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)  # CPU of this thread, not wall time
        profiler.enable()
    if args.gc_young:
        gc.set_threshold(args.gc_young, *gc.get_threshold()[1:])
    collector = CollectorTimer()
    gc.callbacks.append(collector)
    wall0 = time.perf_counter()
    for i in range(n):
        started = time.thread_time()
        status = accept(i)
        cpu.append((time.thread_time() - started) * 1000)
        assert status == 202, status
    wall = time.perf_counter() - wall0
    gc.callbacks.remove(collector)
    if profiler is not None:
        import io
        import pstats

        profiler.disable()
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("cumulative").print_stats(args.cprofile)
        if args.profile_out:
            stats.dump_stats(args.profile_out)
        print(out.getvalue())
    quota = ", with a daily email quota" if args.quota else ""
    through = "config.wsgi's application" if args.wsgi else "Django test client"
    print(f"\n=== bench/accept_cpu.py: {n} single accepts in-process ({through}){quota} ===")
    print(f"request thread CPU per accept   mean {statistics.fmean(cpu):.2f} ms, p50 {percentile(cpu, 50):.2f} ms,")
    print(f"                                p99 {percentile(cpu, 99):.2f} ms")
    print(f"wall per accept (one at a time) {wall / n * 1000:.2f} ms")
    if args.batch:
        per_item = statistics.fmean(cpu) / args.batch
        rate = n * args.batch / wall
        print(f"batch calls of {args.batch} items: {per_item * 1000:.0f} us CPU per item, {rate:.0f} items/s")
    print(
        f"garbage collector (young threshold {gc.get_threshold()[0]}): collections by generation {collector.counts},"
        f" {collector.total * 1000:.0f} ms in all, {collector.total / n * 1000:.3f} ms per accept,"
        f" longest {collector.longest * 1000:.1f} ms"
    )
    print("statements per accept, wall ms per accept:")
    statements.report(per=n, ms_scale=1 / n)
    log("done")


class CollectorTimer:
    """A `gc.callbacks` entry: count the collections by generation and time them (every thread's)."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.total = 0.0
        self.longest = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.counts[info["generation"]] += 1
        self.total += took
        self.longest = max(self.longest, took)


class WsgiClient:
    """Post to the WSGI application gunicorn serves (config/wsgi.py), in this thread."""

    def __init__(self, key: str) -> None:
        from django.test import RequestFactory

        from config.wsgi import application

        self.app: Any = application  # a WSGI callable; answered by the local start_response below
        self.factory = RequestFactory(HTTP_AUTHORIZATION=f"Bearer {key}")

    def post(self, path: str, data: str, content_type: str) -> Any:
        """Return the answer with `status_code` and `json()`, as the test client's."""
        environ = self.factory.post(path, data, content_type=content_type).environ
        answer: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            answer["status"] = int(status.split()[0])

        body = b"".join(self.app(environ, start_response))
        return _Answer(answer["status"], body)


class _Answer:
    def __init__(self, status_code: int, body: bytes) -> None:
        self.status_code = status_code
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


if __name__ == "__main__":
    main()
