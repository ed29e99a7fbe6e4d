"""The floor and the send endpoint, one after the other in one run, under the same server and the same load.

    BENCH_NS=me .venv/bin/python bench/floor.py [--seconds 20] [--connections 16] [--recipients 1000]
        [--servers gunicorn,granian] [--batch-seconds 20] [--priority normal] [--profile-worker] [--profile-api]
    API_CLIENT_RATE_LIMIT=100000/s make run   # then, in another shell, the stack as `make run` ships it:
    .venv/bin/python bench/floor.py --url http://127.0.0.1:8000

The floor is bench/floor_app.py: a bare Django view behind the API's own server settings (gunicorn.conf.py,
WEB_WORKERS x WEB_THREADS; or granian with as many workers and threads) that parses the body, inserts one row
into PostgreSQL and answers 202. Then the project's `POST /api/v1/notifications` takes the same load under the
same server: wrk with --connections connections, every request its own `dedup_key`, one email single to one of
--recipients recipients, sandbox provider, at the template's category's priority (high: transactional) or at
--priority (normal and low wait up to PUBLISH_LINGER_MS in the API's publisher for company). Printed for each:
requests/s and p50/p99/max latency (wrk's own), non-2xx answers; for the send endpoint also accept -> sent (first
accept to the last `sent_at` the database recorded), and the CPU seconds of every process group per request while
it ran; last, the ratios to the floor.
`--servers gunicorn,granian` repeats floor and send endpoint under each server (granian must be installed:
it is not a dependency of the project, docs/decisions/0071-gunicorn-stays.md says why). Last, the batch endpoint
(`POST /api/v1/notifications/batch`, --batch-size items a call from --batch-connections callers) for
--batch-seconds: notifications accepted per second (0 skips it), first beside the send worker on the same
cores, then (without --url) with no send worker running, as where the workers run on other machines, followed
by one send worker draining what was accepted.

--profile-worker samples the send worker with py-spy while the singles load runs (only the thread holding the
GIL) and prints the share of each stage of its work: Celery's per-message work, the database, Redis, the
pipeline's own Python, gather, rendering, the provider call (bench/_profile.py). --profile-api does the same for
the API's gunicorn workers: gunicorn, Django, DRF, authentication, validation, the accept, the group commit, the
publisher. py-spy slows what it samples: read those as shares, and take CPU figures from a run without it.

Without --url the benchmark starts its own API and send worker (threads pool, HIGH_CONCURRENCY threads as the
Procfile's high worker, 8 by default) with production settings (DEBUG off, WARNING
logs) on the bench database (BENCH_NS); with --url it loads a running stack (the demo key in var/demo-api-key,
the `notifier` database, or DATABASE_URL) and starts only the floor beside it. Compare only figures of one run:
this box's speed moves about 2x between hours. wrk is Debian's package `wrk`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ENV,
    ROOT,
    SERVERS,
    ApiServer,
    Worker,
    add_recipients,
    api_key,
    cleanup,
    free_port,
    group_cpu,
    key_environment,
    parser,
    prepare,
    print_cpu,
    psql,
    wait_until,
    workers,
)
from bench._profile import API_STAGES, SEND_WORKER_STAGES, GilProfile, print_shares

# The send worker's threads, as the Procfile's high worker takes them.
HIGH_CONCURRENCY = int(os.environ.get("HIGH_CONCURRENCY", "8"))

# wrk's Lua: each request its own body and dedup key (threads told apart in setup, each wrk run by its own tag, so a
# warm-up's keys never make the measured run's requests duplicates), results on one line.
WRK_SCRIPT = """
local counter, threads = 0, {}
function setup(thread) table.insert(threads, thread); thread:set("tid", #threads) end
function init(args) prefix, recipients, run, extra = args[1], tonumber(args[2]), args[3], args[5] or "" end
function request()
  counter = counter + 1
  local body = string.format(
    '{"recipient": {"user_id": "%s%d"}, "template": "floor_single", "channels": ["email"], ' ..
    '"payload": {"n": %d}, "dedup_key": "%s%s-%d-%d"%s}',
    prefix, counter % recipients, counter, prefix, run, tid, counter, extra)
  return wrk.format("POST", nil, nil, body)
end
function done(summary, latency, requests)
  io.write(string.format("WRK_RESULT %d %d %d %.0f %.0f %.0f\\n", summary.requests, summary.duration,
    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write +
    summary.errors.timeout, latency:percentile(50), latency:percentile(99), latency.max))
end
"""


# The batch endpoint: each call --batch-size items, each with its own dedup key.
WRK_BATCH_SCRIPT = """
local counter, threads = 0, {}
function setup(thread) table.insert(threads, thread); thread:set("tid", #threads) end
function init(args) prefix, recipients, run, size = args[1], tonumber(args[2]), args[3], tonumber(args[4]) end
function request()
  local items = {}
  for i = 1, size do
    counter = counter + 1
    items[i] = string.format(
      '{"recipient": {"user_id": "%s%d"}, "template": "floor_single", "channels": ["email"], ' ..
      '"payload": {"n": %d}, "dedup_key": "%sb%s-%d-%d"}', prefix, counter % recipients, counter, prefix, run, tid,
      counter)
  end
  return wrk.format("POST", nil, nil, '{"notifications": [' .. table.concat(items, ",") .. ']}')
end
""" + WRK_SCRIPT[WRK_SCRIPT.index("function done") :]


def floor_server(server: str, database_url: str) -> ApiServer:
    """Serve bench/floor_app.py under `server` with the API's settings, on a free loopback port."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "GUNICORN_BIND": f"127.0.0.1:{port}"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return ApiServer(port, server=server, app="bench.floor_app:application", env=env)


def wrk(
    url: str,
    *,
    seconds: int,
    connections: int,
    prefix: str,
    recipients: int,
    key: str,
    batch: int = 0,
    priority: str = "",
) -> dict[str, float]:
    """Load `url` with wrk for `seconds`; return requests, requests/s, errors and latency in ms.

    `priority` (singles only) is sent as each body's `priority`; empty, the template's category decides (high).
    """
    extra = f', "priority": "{priority}"' if priority else ""
    script = ROOT / "var" / f"bench-floor-{os.getpid()}{'-batch' if batch else ''}.lua"
    script.write_text(WRK_BATCH_SCRIPT if batch else WRK_SCRIPT)
    command = [
        "wrk", "-t", str(min(2, connections)), "-c", str(connections), "-d", f"{seconds}s", "--timeout", "10s",
        "-s", str(script),
        "-H", "Content-Type: application/json", "-H", f"Authorization: Bearer {key}",
        url, "--", prefix, str(recipients), uuid.uuid4().hex[:8], str(batch), extra,
    ]  # fmt: skip  # wrk refuses more threads than connections
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    found = re.search(r"WRK_RESULT (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)", out)
    if not found:
        raise RuntimeError(f"wrk printed no result:\n{out}")
    requests, micros, errors, p50, p99, top = (int(x) for x in found.groups())
    return {"requests": requests, "rps": requests / (micros / 1e6), "errors": errors} | {
        "p50": p50 / 1000, "p99": p99 / 1000, "max": top / 1000
    }  # fmt: skip


def report(name: str, figures: dict[str, float]) -> None:
    """Print one load's figures."""
    print(f"{name:<26} {figures['rps']:7.0f} req/s   p50 {figures['p50']:5.0f} ms   p99 {figures['p99']:5.0f} ms"
          f"   max {figures['max']:5.0f} ms   errors {figures['errors']:.0f}")  # fmt: skip


def checkpoints(database: str) -> tuple[int, float]:
    """Return PostgreSQL's checkpoints so far and the seconds since the latest one began.

    After a checkpoint begins, the first change of each page writes the whole page to the WAL, and on this box's
    settings (max_wal_size 1 GB) the batch endpoint's writes bring one every minute or two. Printed beside each
    load, so that a run whose PostgreSQL CPU per item stands out can be told apart from one a checkpoint hit.
    """
    found = psql(database, "SELECT checkpoints_timed + checkpoints_req, extract(epoch FROM now() - "
                           "(SELECT checkpoint_time FROM pg_control_checkpoint())) FROM pg_stat_bgwriter")  # fmt: skip
    count, age = found.split("|")
    return int(count), float(age)


def report_checkpoints(before: tuple[int, float], after: tuple[int, float]) -> None:
    """Print how many checkpoints ran during a load and how long before it the one in effect began."""
    print(
        f"PostgreSQL checkpoints during it: {after[0] - before[0]} (the one before began {before[1]:.0f} s "
        "before the load)"
    )


def run(args: Any, *, server: str, database: str, api_url: str, key: str, database_url: str) -> dict[str, float]:
    """Load the floor, then the send endpoint, under `server`; print both and their ratios; return the figures."""
    floor = floor_server(server, database_url)
    try:
        floor.wait_ready()
        psql(database, "CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, body jsonb, at timestamptz)")
        load = {"seconds": args.seconds, "connections": args.connections, "recipients": args.recipients}
        wrk(f"{floor.url}/floor", **load, prefix="warm-", key="-") if args.warmup else None
        floor_figures = wrk(f"{floor.url}/floor", **load, prefix="floor-", key="-")
    finally:
        floor.stop()
        psql(database, "DROP TABLE IF EXISTS bench_floor")
    prefix = f"fl{uuid.uuid4().hex[:6]}-"
    add_recipients(database, prefix, args.recipients, environment_id=key_environment(database, key))
    if args.warmup:
        wrk(f"{api_url}/api/v1/notifications", **{**load, "seconds": 5}, prefix=prefix, key=key, priority=args.priority)
    started = psql(database, "SELECT now()")
    checkpoints0 = checkpoints(database)
    profile = GilProfile(send_worker_pid(), args.seconds - 2) if args.profile_worker else None
    api_profiles = GilProfile.of_many(api_worker_pids(), args.seconds - 2) if args.profile_api else []
    cpu0 = group_cpu()
    api = wrk(f"{api_url}/api/v1/notifications", **load, prefix=prefix, key=key, priority=args.priority)
    cpu1 = group_cpu()
    checkpoints1 = checkpoints(database)
    # One table, by the recipients' addresses: a join with the notifications, planned on statistics from before
    # the run, looped over both for minutes and took a core from the send worker it was waiting for.
    accepted = f"FROM notifier_delivery WHERE address LIKE '{prefix}%' AND created_at >= '{started}'"
    total = int(psql(database, f"SELECT count(*) {accepted}"))
    wait_until(
        lambda: int(psql(database, f"SELECT count(*) {accepted} AND status = 'sent'")) >= total,
        timeout=600, interval=1, what="every accepted single sent",
    )  # fmt: skip
    span = float(psql(database, f"SELECT extract(epoch FROM max(sent_at) - min(created_at)) {accepted}"))
    print(f"\n=== bench/floor.py ({server}; {args.connections} connections, {args.seconds} s each, {api_url}; "
          f"priority {args.priority or 'high (the category)'}) ===")  # fmt: skip
    report("floor (bare Django view)", floor_figures)
    report("POST /api/v1/notifications", api)
    rate = total / span
    print(f"{'accept -> sent':<26} {rate:7.0f} deliveries/s ({total} singles, last sent {span:.1f} s after the first)")
    print(f"ratios to the floor: accepts {api['rps'] / floor_figures['rps']:.2f}x, "
          f"accept -> sent {rate / floor_figures['rps']:.2f}x")  # fmt: skip
    print(f"CPU while the send endpoint was loaded ({api['requests']} requests; every process on the box):")
    print_cpu(cpu0, cpu1, int(api["requests"]))
    report_checkpoints(checkpoints0, checkpoints1)
    if profile is not None:
        print_shares("Where the send worker's time went (py-spy --gil; its CPU figure above is inflated by it)",
                     *profile.shares(SEND_WORKER_STAGES))  # fmt: skip
    if api_profiles:
        print_shares("Where the API's time went (py-spy --gil on each worker; its CPU figure above is inflated by it)",
                     *GilProfile.merged(api_profiles, API_STAGES))  # fmt: skip
    return {"floor": floor_figures["rps"], "send": api["rps"], "send_p99": api["p99"], "sent": rate}


def api_worker_pids() -> list[int]:
    """Return the pids of the API's gunicorn workers (children of a gunicorn serving config.wsgi)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            parent_command = Path(f"/proc/{parent}/cmdline").read_bytes()
        except OSError:
            continue
        if b"gunicorn" in command and b"config.wsgi" in command and b"gunicorn" in parent_command:
            found.append(int(pid))
    if not found:
        raise SystemExit("--profile-api: no gunicorn worker of config.wsgi found")
    return found


def send_worker_pid() -> int:
    """Return the pid of the send worker the singles go to (the bench's own, or `make run`'s high worker)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        names = [command[i + 1] for i, word in enumerate(command[:-1]) if word == b"-n"]
        if b"worker" in command and names and names[0].split(b"@")[0].startswith((b"high", b"bench-floor-high")):
            return int(pid)
    raise SystemExit("--profile-worker: no send worker found (started by this bench, or `make run`'s high worker)")


def run_batch(args: Any, *, database: str, api_url: str, key: str, beside: str = "the send worker") -> str:
    """Load the batch endpoint; print the notifications it accepted per second and the CPU per notification.

    `beside` says what else ran on the box; the prefix of the notifications written is returned.
    """
    prefix = f"fb{uuid.uuid4().hex[:6]}-"
    add_recipients(database, prefix, args.recipients, environment_id=key_environment(database, key))
    load = {"connections": args.batch_connections, "recipients": args.recipients, "batch": args.batch_size}
    started = psql(database, "SELECT now()")
    checkpoints0 = checkpoints(database)
    cpu0 = group_cpu()
    figures = wrk(f"{api_url}/api/v1/notifications/batch", **load, seconds=args.batch_seconds, prefix=prefix, key=key)
    cpu1 = group_cpu()
    checkpoints1 = checkpoints(database)
    written = int(psql(database, f"SELECT count(*) FROM notifier_notification WHERE user_id LIKE '{prefix}%' "
                                 f"AND created_at >= '{started}'"))  # fmt: skip
    seconds = figures["requests"] / figures["rps"] if figures["rps"] else float("nan")
    print(f"\n=== batch endpoint ({args.batch_size} items a call, {args.batch_connections} callers, {api_url}; "
          f"beside it: {beside}) ===")  # fmt: skip
    print(f"batch accept {written / seconds:9.0f} notifications/s ({written} written, {figures['requests']:.0f} calls,"
          f" p50 {figures['p50']:.0f} ms, p99 {figures['p99']:.0f} ms, errors {figures['errors']:.0f})")  # fmt: skip
    print("CPU while the batch endpoint was loaded:")
    print_cpu(cpu0, cpu1, written)
    report_checkpoints(checkpoints0, checkpoints1)
    return prefix


def drain(database: str, prefix: str) -> None:
    """Start a send worker, wait until every delivery of `prefix` is sent, print the rate and its CPU per delivery."""
    of_prefix = f"FROM notifier_delivery d WHERE d.address LIKE '{prefix}%'"
    total = int(psql(database, f"SELECT count(*) {of_prefix}"))
    with workers(Worker("floor-drain", ["email.high", "email.low"], concurrency=HIGH_CONCURRENCY, pool="threads")):
        cpu0 = group_cpu()
        started = float(psql(database, "SELECT extract(epoch FROM now())"))
        wait_until(
            lambda: int(psql(database, f"SELECT count(*) {of_prefix} AND d.status = 'sent'")) >= total,
            timeout=900, interval=1, what="every batch delivery sent",
        )  # fmt: skip
        span = float(psql(database, f"SELECT extract(epoch FROM max(d.sent_at)) {of_prefix}")) - started
        cpu1 = group_cpu()
    print(f"then drained by one send worker alone: {total / span:.0f} deliveries/s ({total} in {span:.1f} s)")
    # Only the worker's CPU: PostgreSQL's figure over this span came out above what two cores can give (probably
    # the stopped API's sessions, booked to the postmaster when reaped), so it would mislead.
    only = "worker high"
    print_cpu({only: cpu0.get(only, 0.0)}, {only: cpu1.get(only, 0.0)}, total, per="delivery")


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--seconds", type=int, default=20, help="seconds of load on each endpoint (0: the batch only)")
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--recipients", type=int, default=1000)
    p.add_argument("--url", help="the API of a running stack (make run); default: start one here")
    p.add_argument("--servers", default="gunicorn", help="comma-separated: gunicorn, granian (without --url)")
    p.add_argument("--batch-seconds", type=int, default=20, help="seconds of load on the batch endpoint (0: none)")
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--batch-connections", type=int, default=4)
    p.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the 5 s warm-up loads")
    p.add_argument("--profile-api", action="store_true",
                   help="sample the API's workers (py-spy) during the singles; print where it went")  # fmt: skip
    p.add_argument("--profile-worker", action="store_true",
                   help="sample the send worker (py-spy) during the singles; print where its time went")  # fmt: skip
    p.add_argument("--priority", choices=["", "high", "normal", "low"], default="",
                   help="the singles' priority (default: their category's, high); normal and low wait up to "
                   "PUBLISH_LINGER_MS in the API for company")  # fmt: skip
    args = p.parse_args()
    servers = [name.strip() for name in args.servers.split(",") if name.strip()]
    if unknown := set(servers) - set(SERVERS):
        sys.exit(f"unknown server(s): {', '.join(sorted(unknown))} (known: {', '.join(SERVERS)})")
    if not shutil.which("wrk"):
        sys.exit("wrk is missing: apt-get install wrk")
    if "granian" in servers and importlib.util.find_spec("granian") is None:
        sys.exit("granian is not installed (it is no dependency of the project): pip install granian")
    if args.url:
        key_file = ROOT / "var" / "demo-api-key"
        if not key_file.exists():
            sys.exit("no var/demo-api-key: start the stack with `make run` first")
        os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/notifier")
        database = os.environ["DATABASE_URL"].rsplit("/", 1)[1]
        template = {"category": "transactional", "content": {"en": {"email": {"subject": "n {{ n }}", "text": "t"}}}}
        key = key_file.read_text().strip()
        subprocess.run(
            ["curl", "-sf", "-o", "/dev/null", "-X", "PUT", f"{args.url}/api/v1/templates/floor_single",
             "-H", f"Authorization: Bearer {key}", "-H", "Content-Type: application/json",
             "-d", json.dumps(template)],
            check=True,
        )  # fmt: skip
        run(args, server="gunicorn", database=database, api_url=args.url, key=key,
            database_url=os.environ["DATABASE_URL"])  # fmt: skip
        if args.batch_seconds:
            run_batch(args, database=database, api_url=args.url, key=key)
        return
    prepare()
    try:
        from templates_app.services import template_put

        template_put(
            key="floor_single",
            category="transactional",
            default_locale="en",
            content={"en": {"email": {"subject": "n {{ n }}", "text": "t"}}},
        )
        key = api_key()
        database = ENV["DATABASE_URL"].rsplit("/", 1)[1]
        send = Worker("floor-high", ["email.high", "email.low"], concurrency=HIGH_CONCURRENCY, pool="threads")
        results: dict[str, dict[str, float]] = {}
        with workers(send):
            for name in servers:
                server = ApiServer(server=name)
                try:
                    server.wait_ready()
                    if args.seconds:
                        results[name] = run(args, server=name, database=database, api_url=server.url, key=key,
                                            database_url=ENV["DATABASE_URL"])  # fmt: skip
                    if args.batch_seconds and name == servers[-1]:
                        run_batch(args, database=database, api_url=server.url, key=key)
                finally:
                    server.stop()
        if args.batch_seconds:
            # The accept alone, as where the send workers run on other machines: the queues hold what it
            # accepted, and one worker started afterwards drains them.
            server = ApiServer(server=servers[-1])
            try:
                server.wait_ready()
                prefix = run_batch(args, database=database, api_url=server.url, key=key, beside="no send worker")
            finally:
                server.stop()
            drain(database, prefix)
        if len(results) > 1:
            print("\n=== servers side by side (requests/s; accept -> sent in deliveries/s) ===")
            for name, figures in results.items():
                print(f"{name:<10} floor {figures['floor']:6.0f}   send {figures['send']:6.0f} (p99 "
                      f"{figures['send_p99']:.0f} ms)   accept -> sent {figures['sent']:6.0f}")  # fmt: skip
    finally:
        cleanup(args.keep)


if __name__ == "__main__":
    main()
