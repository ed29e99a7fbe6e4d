"""Shared plumbing of the benchmarks: a dedicated database and vhost, real workers, RSS sampling, cleanup.

Benchmarks never touch the development or test databases: they create `bench_notifier` (migrated from
scratch) and the RabbitMQ vhost `notifier_bench`, start their own `celery worker` subprocesses, and drop both
at the end (pass --keep to look around afterwards).
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from core.chat import CHAT_CHANNELS

ROOT = Path(__file__).resolve().parent.parent
# BENCH_NS gives a run its own database and vhost (several people benchmarking on one box).
_NS = os.environ.get("BENCH_NS", "")
DB_NAME = f"bench_notifier_{_NS}" if _NS else "bench_notifier"
VHOST = f"notifier_bench_{_NS}" if _NS else "notifier_bench"
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
# The machine's RabbitMQ unless a run names a node it started itself (as the tests: host:port and node name).
BROKER_URL = f"amqp://guest:guest@{os.environ.get('BENCH_AMQP', '127.0.0.1:5672')}/{VHOST}"
_NODE = ["-n", os.environ["BENCH_RABBITMQ_NODE"]] if os.environ.get("BENCH_RABBITMQ_NODE") else []
ENV = {
    "DATABASE_URL": DATABASE_URL,
    "CELERY_BROKER_URL": BROKER_URL,
    "REDIS_KEY_PREFIX": f"notifier-bench{_NS}:",
    # DEBUG off: no query log, no debug cursor formatting 5,000-element arrays.
    "DEBUG": "false",
    "SECRET_KEY": "bench-only-secret",
    "LOG_LEVEL": "WARNING",
    "OUTBOX_RELAY_INTERVAL_SECONDS": "3600",
    "PYTHONUNBUFFERED": "1",
    "DJANGO_SETTINGS_MODULE": "config.settings",
}
SEND_CHANNELS = ("push", "email", "sms", "inapp", "webhook", *CHAT_CHANNELS)
SEND_QUEUES = [f"{c}.{p}" for c in SEND_CHANNELS for p in ("high", "low")]


def parser(description: str) -> argparse.ArgumentParser:
    """Return an argument parser with the options every benchmark shares."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--keep", action="store_true", help="keep the bench database and vhost afterwards")
    p.add_argument("--timeout", type=float, default=600, help="give up after this many seconds")
    return p


def log(message: str) -> None:
    """Print a progress line with a timestamp."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _psql(sql: str, db: str = "postgres") -> None:
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-qc", sql], check=True, capture_output=True)


def _ensure_vhost() -> None:
    """Create the bench vhost unless it exists; it is reused, never deleted (core.queues.purge_queues says why)."""
    try:
        subprocess.run(["rabbitmqctl", *_NODE, "-q", "add_vhost", VHOST], capture_output=True, check=False, timeout=60)
        permissions = ["rabbitmqctl", *_NODE, "-q", "set_permissions", "-p", VHOST, "guest", ".*", ".*", ".*"]
        subprocess.run(permissions, capture_output=True, check=True, timeout=60)
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError):
        # A broken broker need not stop the benchmarks that do not use it (inbox_streams.py --direct).
        log("rabbitmqctl failed or did not answer within 60 s: the broker is unavailable")


def _purge_vhost() -> None:
    from config.celery import app
    from core.queues import purge_queues

    try:
        purge_queues(app)
    except Exception as exc:  # the broker is away: the benchmarks that need it say so themselves
        log(f"could not purge the bench vhost: {type(exc).__name__}")


def add_history_options(p: argparse.ArgumentParser) -> None:
    """Add --history-days and --history-per-day: finished days loaded before the run (fill_history)."""
    p.add_argument("--history-days", type=int, default=0, help="past days of finished deliveries loaded first")
    p.add_argument("--history-per-day", type=int, default=0, help="deliveries per history day")


def prepare(*, broker: bool = True, history_days: int = 0, history_per_day: int = 0) -> None:
    """Create the bench database from scratch and the vhost if missing (emptied), migrate, and set up Django.

    Without `broker` the vhost is left alone: a benchmark of the database alone does not touch RabbitMQ.
    With `history_days` and `history_per_day`, that many past days of finished deliveries are loaded
    (fill_history) before the benchmark starts.
    """
    os.environ.update(ENV)
    if broker:
        _ensure_vhost()
    _psql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    _psql(f"CREATE DATABASE {DB_NAME}")
    log("migrating the bench database")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env={**os.environ}, check=True)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    if broker:
        _purge_vhost()
    if history_days and history_per_day:
        fill_history(history_days, history_per_day)


def cleanup(keep: bool, *, broker: bool = True) -> None:
    """Drop the bench database and its Redis keys (unless keep) and empty the vhost (with `broker`); it stays."""
    from django.conf import settings
    from django.db import connections

    connections.close_all()
    if keep:
        log(f"kept database {DB_NAME} and vhost {VHOST}")
        return
    _psql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    # Dedup keys live for a day: a few runs of the batch leave hundreds of thousands in the shared Redis.
    _delete_redis_keys(settings.REDIS_URL, ENV["REDIS_KEY_PREFIX"])
    if broker:
        _purge_vhost()


def _delete_redis_keys(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    batch = []
    for key in client.scan_iter(f"{prefix}*", count=5000):
        batch.append(key)
        if len(batch) >= 5000:
            client.unlink(*batch)
            batch.clear()
    if batch:
        client.unlink(*batch)


# ---- history: finished days written set-based into their day partitions --------------------------------------

# A UUIDv7 for row k of the day: the day's noon in milliseconds, version 7, variant 10, then md5 bits.
_UUID7 = (
    "(lpad(to_hex(%(ms)s::bigint), 12, '0') || '7' || substr(md5(({k})::text), 1, 3) || '8'"
    " || substr(md5(({k})::text), 4, 15))::uuid"
)

_FILL_NOTIFICATIONS = """
INSERT INTO notifier_notification (id, client_id, request_hash, category, template_key, channels, payload,
    recipient_id, user_id, priority, locale, send_at_local, strategy, fallback_until, status, fanout_processed,
    trace_id, created_at, updated_at)
SELECT {uuid}, %(client)s, 'h', 'transactional', 'welcome', '{{email,sms}}', '{{}}', %(r0)s + k %% %(rn)s,
       'u-bench', 'normal', '', '', 'all', '', 'done', 0, '', %(born)s, %(born)s
FROM generate_series(1, %(notifications)s) k
"""

# One address per delivery, as real traffic has: the hash index on address degrades badly on a repeated value.
# Delivery g belongs to notification `{owner}`: groups of the sizes in `per_notification`, repeated.
_FILL_DELIVERIES = """
INSERT INTO notifier_delivery (id, notification_id, recipient_id, channel, priority, address, status, reason,
    provider, provider_message_id, pinned_provider, attempts, last_error, sms_encoding, created_at, updated_at,
    sent_at)
SELECT %(low)s + g, {uuid}, %(r0)s + g %% %(rn)s, CASE WHEN g %% 2 = 0 THEN 'sms' ELSE 'email' END, 'normal',
       CASE WHEN g %% 2 = 0 THEN '+1555' || lpad(g::text, 7, '0') ELSE 'b' || g || '@example.com' END,
       CASE WHEN g %% 3 = 0 THEN 'sent' ELSE 'delivered' END, '', 'sandbox',
       'm-' || g, '', 1, '', '', %(created)s, %(created)s, %(created)s
FROM generate_series(1, %(deliveries)s) g
"""

_FILL_EVENTS = """
INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at)
SELECT %(low)s + g, s, '', %(created)s FROM generate_series(1, %(deliveries)s) g, unnest(ARRAY['queued', 'sent']) s
"""

HOT_TABLES = ("notifier_notification", "notifier_delivery", "notifier_deliveryevent")


def mib(n: float) -> str:
    """Format a byte count in MiB."""
    return f"{n / 1024 / 1024:,.1f} MiB"


def fill_day(
    day: date,
    deliveries: int,
    *,
    created: datetime,
    per_notification: tuple[int, ...] = (2,),
    recipients: tuple[int, int] | None = None,
    analyze: bool = True,
) -> float:
    """Write one day of finished deliveries (ids of `day`), two events each, and their notifications.

    Notifications take `day`'s noon (UUIDv7 and created_at) and own the deliveries in groups of the sizes of
    `per_notification`, repeated; deliveries and events take `created`. `recipients` is (first id, how many)
    of a contiguous range the rows are spread over (default: one bench recipient). With `analyze` the parent
    tables are analyzed after (which samples every partition again). Return the seconds taken.
    """
    from django.db import connection

    from notifier.clients.models import ApiClient
    from notifier.deliveries.partitions import delivery_id_bounds
    from preferences.models import Recipient

    client, _ = ApiClient.objects.get_or_create(name="bench", defaults={"key_prefix": "bench", "key_hash": "b" * 64})
    if recipients is None:
        recipient, _ = Recipient.objects.get_or_create(user_id="u-bench", defaults={"email": "bench@example.com"})
        recipients = (recipient.pk, 1)
    # Delivery g (from 1) -> its notification: whole cycles of len(per_notification) notifications, then the
    # group within the cycle, looked up by the delivery's offset in it.
    cycle = sum(per_notification)
    groups = [i for i, size in enumerate(per_notification) for _ in range(size)]
    owner = f"((g - 1) / {cycle} * {len(per_notification)} + (ARRAY{groups})[(g - 1) % {cycle} + 1] + 1)"
    full, rest = divmod(deliveries, cycle)
    born = datetime.combine(day, datetime.min.time(), tzinfo=UTC) + timedelta(hours=12)
    params: dict[str, Any] = {
        "ms": int(born.timestamp() * 1000),
        "client": client.pk,
        "r0": recipients[0],
        "rn": recipients[1],
        "born": born,
        "notifications": full * len(per_notification) + (groups[rest - 1] + 1 if rest else 0),
        "deliveries": deliveries,
        "low": delivery_id_bounds(day)[0],
        "created": created,
    }
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(_FILL_NOTIFICATIONS.format(uuid=_UUID7.format(k="k")), params)
        cursor.execute(_FILL_DELIVERIES.format(uuid=_UUID7.format(k=owner.replace("%", "%%"))), params)
        cursor.execute(_FILL_EVENTS, params)
        if analyze:
            cursor.execute("ANALYZE notifier_delivery; ANALYZE notifier_deliveryevent; ANALYZE notifier_notification")
    return time.monotonic() - started


def table_sizes() -> dict[str, int]:
    """Return the total size (heap, indexes, TOAST) of each hot table, all its partitions together."""
    from django.db import connection

    out = {}
    with connection.cursor() as cursor:
        for table in HOT_TABLES:
            cursor.execute(
                "SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits"
                " WHERE inhparent = %s::regclass",
                [table],
            )
            out[table] = int(cursor.fetchone()[0])
    return out


def fill_history(days: int, per_day: int, *, recipients: int = 100_000) -> None:
    """Load `days` past days (yesterday back) of `per_day` finished deliveries each into real day partitions.

    Each day's three partitions are created, filled set-based (fill_day: notifications of 2 to 10 deliveries,
    two events per delivery, spread over `recipients` recipients), and VACUUM ANALYZEd, one day at a time.
    Prints the fill time and sizes.
    """
    from django.db import connection
    from django.utils import timezone

    from notifier.deliveries import partitions

    log(f"history: {days} days x {per_day:,} deliveries")
    n = min(recipients, per_day)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO preferences_recipient (user_id, email, phone, locale, timezone, webhook_url, opted_out, "
            "channel_prefs, category_prefs, created_at, updated_at) "
            "SELECT 'h-' || g, 'h-' || g || '@example.com', '', '', '', '', false, '{}', '{}', now(), now() "
            "FROM generate_series(1, %s) g RETURNING id",
            [n],
        )
        ids = [row[0] for row in cursor.fetchall()]
    assert max(ids) - min(ids) + 1 == n, "the history recipients' ids are not contiguous"
    today = timezone.now().astimezone(UTC).date()
    started, cpu = time.monotonic(), time.process_time()
    for back in range(days, 0, -1):
        day = today - timedelta(days=back)
        for table in HOT_TABLES:
            partitions.create_partition(table, day)
        created = datetime.combine(day, datetime.min.time(), tzinfo=UTC) + timedelta(hours=12, minutes=1)
        t0 = time.monotonic()
        # The day's own partitions are analyzed by the VACUUM below, the parents once at the end.
        fill_day(
            day, per_day, created=created, per_notification=tuple(range(2, 11)), recipients=(min(ids), n), analyze=False
        )
        t1 = time.monotonic()
        names = ", ".join(f'"{partitions.partition_name(t, day)}"' for t in HOT_TABLES)
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM (ANALYZE) {names}")
        log(f"  {day}: filled in {t1 - t0:.1f} s, vacuumed in {time.monotonic() - t1:.1f} s")
    t1 = time.monotonic()
    with connection.cursor() as cursor:
        # The parents' own statistics (autovacuum never analyzes a partitioned table).
        cursor.execute(f"ANALYZE {', '.join(HOT_TABLES)}, preferences_recipient")
    log(f"  parents analyzed in {time.monotonic() - t1:.1f} s")
    seconds = time.monotonic() - started
    total = days * per_day
    sizes = table_sizes()
    log(
        f"history loaded: {total:,} deliveries in {seconds:.0f} s ({seconds / total * 1e6:.0f} s per million,"
        f" client CPU {time.process_time() - cpu:.1f} s)"
    )
    for table, size in sizes.items():
        log(f"  {table:<24} {mib(size):>14}")
    log(f"  {'all three':<24} {mib(sum(sizes.values())):>14}")


def stop_process_group(proc: subprocess.Popen[Any], *, grace: float = 20) -> None:
    """Stop a process started with start_new_session=True and its children: SIGTERM, then SIGKILL after `grace`."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


class Worker:
    """A `celery worker` subprocess on the bench database and vhost."""

    def __init__(self, name: str, queues: list[str], *, concurrency: int = 2, pool: str = "prefork", **env: str):
        self.name = name
        self.log_path = ROOT / "var" / f"bench-{name}-{os.getpid()}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self._log = self.log_path.open("w")
        # At INFO, the production manifests' LOG_LEVEL, whatever ENV gives the API: "ready." is an INFO line.
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", ",".join(queues), "--pool", pool,
                "--concurrency", str(concurrency), "--loglevel", "INFO", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "-n", f"bench-{name}-{os.getpid()}@%h",
            ],
            cwd=ROOT, env={**os.environ, **ENV, **env}, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 300) -> Worker:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.log_path.read_text()[-3000:]}")
            if "ready." in self.log_path.read_text():
                return self
            time.sleep(0.2)
        raise TimeoutError(f"worker {self.name} not ready")

    def rss_bytes(self) -> int:
        """Return the resident memory of the worker and its pool processes."""
        import psutil

        try:
            main = psutil.Process(self.proc.pid)
            return sum(p.memory_info().rss for p in [main, *main.children(recursive=True)])
        except psutil.NoSuchProcess:
            return 0

    def cpu_seconds(self) -> float:
        """Return the CPU time (user + system) used so far by the worker and its pool processes."""
        return process_tree_cpu(self.proc.pid)

    def stop(self) -> None:
        stop_process_group(self.proc, grace=30)
        self._log.close()


@contextmanager
def workers(*started: Worker) -> Iterator[list[Worker]]:
    """Wait for workers to be ready and stop them all at the end."""
    try:
        for w in started:
            w.wait_ready()
        yield list(started)
    finally:
        for w in started:
            w.stop()


def process_tree_cpu(pid: int) -> float:
    """Return the CPU seconds of a process and its descendants, those that exited too (pool or worker restarts).

    A live child counts through its own times; one that exited and was reaped counts through its parent's
    children_user/children_system.
    """
    import psutil

    try:
        main = psutil.Process(pid)
        return sum(main.cpu_times()[:4]) + sum(sum(p.cpu_times()[:2]) for p in main.children(recursive=True))
    except psutil.NoSuchProcess:
        return 0.0


def service_cpu_seconds() -> dict[str, float]:
    """Return the CPU time used so far by the PostgreSQL, RabbitMQ and Redis server processes on this box.

    Exited children count through their parent's children_user/children_system (PostgreSQL backends of
    closed connections).
    """
    import psutil

    totals = {"postgresql": 0.0, "rabbitmq": 0.0, "redis": 0.0}
    names = {"postgres": "postgresql", "beam.smp": "rabbitmq", "redis-server": "redis"}
    for proc in psutil.process_iter(["name", "cpu_times"]):
        service = names.get(proc.info["name"] or "")
        if service and proc.info["cpu_times"] is not None:
            totals[service] += sum(proc.info["cpu_times"][:4])
    return totals


def wait_until(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.2, what: str = "") -> float:
    """Poll until predicate() is truthy; return the seconds waited, or raise TimeoutError."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def empty_task_rate(n: int = 3000) -> dict[str, float]:
    """Measure publish and consume rates of an empty task on this broker (a prefork worker of 2, late acks)."""
    from config.celery import app

    # Its "succeeded" lines are counted.
    worker = Worker("noop", ["maintenance"], concurrency=2, CELERY_TASK_LOGS="true")
    with workers(worker):
        started = time.monotonic()
        with app.producer_or_acquire() as producer:
            for _ in range(n):
                app.send_task("notifier.tasks.noop", queue="maintenance", producer=producer)
        published = time.monotonic() - started
        wait_until(lambda: worker.log_path.read_text().count("succeeded") >= n, timeout=300, what="noop tasks")
        total = time.monotonic() - started
    return {"tasks": n, "publish_per_s": n / published, "end_to_end_per_s": n / total}


def make_topic(key: str, n: int) -> int:
    """Create a topic with n subscribers (recipients with an email) using set-based SQL; return the topic id."""
    from django.db import connection

    from preferences.models import Topic

    topic = Topic.objects.create(key=key, name=key)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO preferences_recipient (user_id, email, phone, locale, timezone, webhook_url, opted_out, "
            "channel_prefs, category_prefs, created_at, updated_at) "
            "SELECT %s || g, %s || g || '@example.com', '', '', '', '', false, '{}', '{}', now(), now() "
            "FROM generate_series(1, %s) g",
            [f"{key}-", f"{key}-", n],
        )
        cursor.execute(
            "INSERT INTO preferences_subscription (topic_id, recipient_id, created_at) "
            "SELECT %s, id, now() FROM preferences_recipient WHERE user_id LIKE %s ORDER BY id",
            [topic.pk, f"{key}-%"],
        )
        cursor.execute("ANALYZE preferences_recipient; ANALYZE preferences_subscription")
    return topic.pk


def psql(database: str, sql: str) -> str:
    """Run SQL (one statement or several) on `database` with the psql client; return its unaligned output."""
    found = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", database, "-Atc", sql],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return found.stdout.strip()


def add_recipients(database: str, prefix: str, n: int, *, environment_id: int = 1) -> None:
    """Insert n recipients with an email, user ids prefix0 .. prefix(n-1), in an environment (the default's)."""
    psql(
        database,
        "INSERT INTO preferences_recipient (environment_id, user_id, email, phone, locale, timezone, webhook_url, "
        "opted_out, channel_prefs, category_prefs, created_at, updated_at) "
        f"SELECT {int(environment_id)}, '{prefix}' || g, '{prefix}' || g || '@example.com', '', '', '', '', false, "
        f"'{{}}', '{{}}', now(), now() FROM generate_series(0, {n - 1}) g",
    )  # the prefix is ours, not a caller's text


def key_environment(database: str, raw_key: str) -> int:
    """Return the environment of the API key `raw_key` (its recipients must be there to be found)."""
    prefix = raw_key.split("_")[1]  # "ntf_<prefix>_<secret>" (notifier/clients/auth.py)
    if not re.fullmatch(r"[0-9a-f]{8}", prefix):
        raise ValueError("not an API key")
    return int(psql(database, f"SELECT environment_id FROM notifier_apiclient WHERE key_prefix = '{prefix}'"))


def make_template(key: str, category: str) -> None:
    """Create a small template on email and sms."""
    from templates_app.services import template_put

    content = {"en": {"email": {"subject": "Hi {{ n }}", "text": "Hello {{ n }}"}, "sms": {"text": "Code {{ n }}"}}}
    template_put(key=key, category=category, default_locale="en", content=content)


def percentile(values: list[float], q: float) -> float:
    """Return the q-th percentile (0-100) of values, by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def mean(values: list[float]) -> float:
    """Return the mean, NaN for none."""
    return statistics.fmean(values) if values else float("nan")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def in_parallel(
    host: str, port: int, clients: int, n: int, call: Callable[[http.client.HTTPConnection, int], Any]
) -> list[Any]:
    """Run `call(connection, i)` for i in range(n) from `clients` threads, each with its own keep-alive connection.

    Return the results in order of i.
    """
    results: list[Any] = [None] * n

    def work(c: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=120)
        for i in range(c, n, clients):
            results[i] = call(conn, i)
        conn.close()

    threads = [threading.Thread(target=work, args=(c,)) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


SERVERS = ("gunicorn", "granian")


def server_command(server: str, app: str, *, port: int, workers: int, threads: int) -> list[str]:
    """Return the command serving the WSGI `app` under `server`: gunicorn as the Procfile runs it, or granian alike."""
    if server == "granian":
        # The same shape as gunicorn.conf.py: `workers` processes of `threads` request threads, no access log.
        return [
            sys.executable, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(workers), "--blocking-threads", str(threads), "--no-ws", "--log-level", "warning", app,
        ]  # fmt: skip
    # As the Procfile runs it (gunicorn.conf.py: request recycling, keep-alive, no access log).
    return [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", app]


class ApiServer:
    """The real HTTP API (or another WSGI app) under gunicorn or granian on a loopback port, on the bench database."""

    def __init__(
        self,
        port: int = 0,
        workers: int = 2,
        threads: int = 16,
        *,
        server: str = "gunicorn",
        app: str = "config.wsgi:application",
        env: dict[str, str] | None = None,
    ) -> None:
        # Port 0: a free one. Eight people benchmark on this box: with one fixed port, two overlapping runs meet, and
        # the second's clients talk to the first's server (another database).
        port = port or free_port()
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = ROOT / "var" / f"bench-api-{server}-{os.getpid()}.log"
        self._log = self.log_path.open("w")
        workers = int(os.environ.get("WEB_WORKERS", str(workers)))
        threads = int(os.environ.get("WEB_THREADS", str(threads)))
        self.proc = subprocess.Popen(
            server_command(server, app, port=port, workers=workers, threads=threads),
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            env=env if env is not None else {
                **os.environ, **ENV, "GUNICORN_BIND": f"127.0.0.1:{port}",
                "WEB_WORKERS": str(workers), "WEB_THREADS": str(threads),
            },
        )  # fmt: skip

    def wait_ready(self) -> ApiServer:
        import urllib.request

        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the API server exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{self.url}/healthz", timeout=1)
                return True
            except OSError:
                return False

        wait_until(up, timeout=60, what="the API")
        return self

    def stop(self) -> None:
        stop_process_group(self.proc)
        self._log.close()


def api_key() -> str:
    """Create an API client allowed every category and scope and return its raw key."""
    from core.scopes import SCOPES
    from notifier.clients.services import api_client_create

    client, raw_key = api_client_create(name=f"bench-{time.time_ns()}", scopes=list(SCOPES))
    client.rate_limit = "1000000/s"  # a benchmark measures the pipeline, not the per-client API limit
    client.save(update_fields=["rate_limit"])
    return raw_key


class StatementCounter:
    """Count every statement this process runs (the hot paths' raw cursor and Django's own), with wall time."""

    def __init__(self) -> None:
        self.stats: dict[str, list[float]] = {}

    @staticmethod
    def label(sql: str) -> str:
        """Name a statement by its first word and the first table it names."""
        words = " ".join(sql.split())
        table = ""
        for marker in ("notifier_", "channels_app_", "preferences_", "templates_app_", "audit_"):
            at = words.find(marker)
            if at >= 0:
                table = words[at:].split()[0].strip('"(),')
                break
        head = words.split(None, 1)[0].upper() if words else "?"
        if "pg_notify" in words:
            head += " (reach)"
        return f"{head} {table}"[:70]

    def count(self, sql: str, seconds: float) -> None:
        """Add one statement."""
        entry = self.stats.setdefault(self.label(sql), [0, 0.0])
        entry[0] += 1
        entry[1] += seconds

    def clear(self) -> None:
        """Forget what was counted."""
        self.stats.clear()

    def install(self) -> StatementCounter:
        """Wrap core.db's cursor and add a Django execute wrapper to the default connection."""
        from django.db import connection

        from core import db

        original = db._LoggedCursor.execute
        counter = self

        def execute(self: Any, sql: str, params: Any = None, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(self, sql, params, **kwargs)
            finally:
                counter.count(sql, time.perf_counter() - started)

        db._LoggedCursor.execute = execute  # type: ignore[method-assign]

        def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            started = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                counter.count(sql, time.perf_counter() - started)

        connection.ensure_connection()
        connection.execute_wrappers.insert(0, wrapper)
        return self

    def report(self, *, per: float, ms_scale: float) -> None:
        """Print statements per unit (`per` units counted) and their wall ms times `ms_scale`."""
        total_count = sum(c for c, _ in self.stats.values())
        total_s = sum(s for _, s in self.stats.values())
        for label, (count, seconds) in sorted(self.stats.items(), key=lambda kv: -kv[1][1]):
            print(f"  {count / per:7.1f}  {seconds * 1000 * ms_scale:7.1f} ms  {label}")
        print(f"  {total_count / per:7.1f}  {total_s * 1000 * ms_scale:7.1f} ms  (all statements)")


# Process groups by a piece of their command line; the first match wins.
# Workers match both as the Procfile names them (`-n high@%h`) and as Worker below does (`-n bench-high-<pid>@`).
GROUPS = [
    ("floor (bare view)", "bench.floor_app"),
    # Before the others: honcho's command line lists the Procfile's process names (... stream beat flower).
    ("honcho (log lines)", "honcho"),
    ("api (gunicorn)", "gunicorn"),
    ("api (granian)", "granian"),
    ("worker high", "high"),
    ("worker low", "low"),
    ("worker events", "events"),
    ("worker fanout", "fanout"),
    ("worker maintenance", "maintenance"),
    ("load generator (wrk)", "wrk "),
    ("flower", "flower"),
    ("beat", " beat"),
    ("streams (uvicorn)", "uvicorn"),
    # uvicorn's --workers children are spawned: their command line names multiprocessing, not uvicorn.
    ("streams (uvicorn)", "multiprocessing.spawn"),
    ("bench client", "bench/"),
    ("postgresql", "postgres"),
    ("rabbitmq", "beam"),
    ("redis", "redis-server"),
]


def group_cpu() -> dict[str, float]:
    """Return the CPU seconds of every process group on the box, reaped children included."""
    tick = os.sysconf("SC_CLK_TCK")
    totals: dict[str, float] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it exited meanwhile
        seconds = sum(int(fields[i]) for i in (11, 12, 13, 14)) / tick  # utime, stime, cutime, cstime
        for name, piece in GROUPS:
            if piece in command and (not name.startswith("worker") or " worker " in f" {command}"):
                totals[name] = totals.get(name, 0.0) + seconds
                break
    return totals


def print_cpu(before: dict[str, float], after: dict[str, float], n: int, *, per: str = "single") -> None:
    """Print each group's CPU seconds between two snapshots, and per single (or per `per`)."""
    for name in sorted(after, key=lambda k: before.get(k, 0.0) - after[k]):
        used = after[name] - before.get(name, 0.0)
        if used >= 0.05:
            print(f"  {name:<20} {used:6.1f} s   {used / n * 1000:5.2f} ms per {per}")
