"""Shared plumbing of the benchmarks: a dedicated database and vhost, real workers, RSS sampling, cleanup.

Benchmarks never touch the development or test databases: they create `bench_notifier` (migrated from
scratch) and the RabbitMQ vhost `notifier_bench`, start their own `celery worker` subprocesses, and drop both
at the end (pass --keep to look around afterwards).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# BENCH_NS gives a run its own database and vhost (several people benchmarking on one box).
_NS = os.environ.get("BENCH_NS", "")
DB_NAME = f"bench_notifier_{_NS}" if _NS else "bench_notifier"
VHOST = f"notifier_bench_{_NS}" if _NS else "notifier_bench"
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
BROKER_URL = f"amqp://guest:guest@127.0.0.1:5672/{VHOST}"
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
SEND_QUEUES = [f"{c}.{p}" for c in ("push", "email", "sms", "inapp", "webhook") for p in ("high", "low")]


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
        subprocess.run(["rabbitmqctl", "-q", "add_vhost", VHOST], capture_output=True, check=False, timeout=60)
        permissions = ["rabbitmqctl", "-q", "set_permissions", "-p", VHOST, "guest", ".*", ".*", ".*"]
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


def prepare(*, broker: bool = True) -> None:
    """Create the bench database from scratch and the vhost if missing (emptied), migrate, and set up Django.

    Without `broker` the vhost is left alone: a benchmark of the database alone does not touch RabbitMQ.
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


def cleanup(keep: bool, *, broker: bool = True) -> None:
    """Drop the bench database (unless keep) and empty the vhost (with `broker`, as in prepare); it stays."""
    from django.db import connections

    connections.close_all()
    if keep:
        log(f"kept database {DB_NAME} and vhost {VHOST}")
        return
    _psql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    if broker:
        _purge_vhost()


class Worker:
    """A `celery worker` subprocess on the bench database and vhost."""

    def __init__(self, name: str, queues: list[str], *, concurrency: int = 2, pool: str = "prefork", **env: str):
        self.name = name
        self.log_path = ROOT / "var" / f"bench-{name}-{os.getpid()}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self._log = self.log_path.open("w")
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
        import psutil

        try:
            main = psutil.Process(self.proc.pid)
            return sum(sum(p.cpu_times()[:2]) for p in [main, *main.children(recursive=True)])
        except psutil.NoSuchProcess:
            return 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
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

    worker = Worker("noop", ["maintenance"], concurrency=2)
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


class ApiServer:
    """The real HTTP API under gunicorn on a loopback port, on the bench database and vhost."""

    def __init__(self, port: int = 0, workers: int = 2, threads: int = 4) -> None:
        # Port 0: a free one. Eight people benchmark on this box: with one fixed port, two overlapping runs meet, and
        # the second's clients talk to the first's server (another database).
        port = port or free_port()
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = ROOT / "var" / f"bench-api-{os.getpid()}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "gunicorn", "config.wsgi:application", "-b", f"127.0.0.1:{port}",
                "-w", str(workers), "--threads", str(threads), "--access-logfile", "/dev/null",
            ],
            cwd=ROOT, env={**os.environ, **ENV}, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
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
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


def api_key() -> str:
    """Create an API client allowed every category and scope and return its raw key."""
    from core.scopes import SCOPES
    from notifier.services import api_client_create

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
