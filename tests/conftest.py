"""Shared fixtures: real PostgreSQL, RabbitMQ and Redis, isolated per test namespace, and real workers.

Each run uses its own test database (`test_notifier_<ns>`), RabbitMQ vhost (`notifier_test_<ns>`) and Redis
key prefix, with `<ns>` from NOTIFIER_TEST_NS (default "main"), so several runs can share one machine; under
pytest-xdist each worker is such a run, `<ns>_gw0`, `<ns>_gw1`, ...

Tests marked `pure` touch none of the three: they run without them (`make test-fast`), and neither the vhost
nor the Redis cleanup is set up for them.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import hypothesis
import pytest
from django.conf import settings

from config.celery import app as celery_app
from core.queues import CHANNELS, purge_queues
from tests.testdb import use_migrated_template
from tests.zygote import ForkedProcess, Zygote, changes_import_time_env

if TYPE_CHECKING:
    pass

pytest_plugins = ["tests.stubs.fixtures", "tests.browser"]

# Property tests (the fast tier's rules): the same 50 examples on every run and machine, so a failure is
# reproduced by running the test again; no deadline (a shared, loaded machine is slow at times) and no example
# database written into the checkout. `--hypothesis-profile=thorough` searches further, with new examples each run.
hypothesis.settings.register_profile("notifier", derandomize=True, deadline=None, database=None, max_examples=50)
hypothesis.settings.register_profile("thorough", deadline=None, database=None, max_examples=2000)
hypothesis.settings.load_profile("notifier")

ROOT = Path(__file__).resolve().parent.parent
# Under pytest-xdist each worker process is a run of its own, in the namespace `<ns>_<worker id>` ("main_gw0"):
# its own test database, vhost and Redis prefix. pytest-django's own suffix is turned off below, so the
# database's name is this one from the start (worker subprocesses get it through test_database_url()).
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
NS = f"{settings.TEST_NAMESPACE}_{XDIST_WORKER}" if XDIST_WORKER else settings.TEST_NAMESPACE
settings.DATABASES["default"]["TEST"]["NAME"] = f"test_notifier_{NS}"
VHOST = f"notifier_test_{NS}"
# The machine's RabbitMQ unless a run names another node it started itself (host:port and its node name).
AMQP_ADDRESS = os.environ.get("NOTIFIER_TEST_AMQP", "127.0.0.1:5672")
RABBITMQ_NODE = os.environ.get("NOTIFIER_TEST_RABBITMQ_NODE", "")
BROKER_URL = f"amqp://guest:guest@{AMQP_ADDRESS}/{VHOST}"
REDIS_PREFIX = f"notifier-test:{NS}:"
T = TypeVar("T")


def rabbitmqctl(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """Run rabbitmqctl against the test broker's node."""
    node = ["-n", RABBITMQ_NODE] if RABBITMQ_NODE else []
    return subprocess.run(["rabbitmqctl", *node, "-q", *args], capture_output=True, check=check, timeout=timeout)


def _ensure_vhost() -> None:
    """Create this namespace's RabbitMQ vhost (idempotent) with full rights for guest."""
    rabbitmqctl("add_vhost", VHOST, check=False)
    rabbitmqctl("set_permissions", "-p", VHOST, "guest", ".*", ".*", ".*")


celery_app.conf.broker_url = BROKER_URL  # type: ignore[misc]  # a settable key; celery-types: read-only
settings.CELERY_BROKER_URL = BROKER_URL
settings.REDIS_KEY_PREFIX = REDIS_PREFIX
# Webhook tests talk to stand-in receivers on loopback.
settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = False


def test_database_url() -> str:
    """Return the DATABASE_URL of the test database, for worker subprocesses."""
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['TEST']['NAME']}"


test_database_url.__test__ = False  # type: ignore[attr-defined]  # pytest's marker: not a test


def purge_all_queues() -> None:
    """Drop every message in this namespace's queues (work, dead-letter and delayed)."""
    purge_queues(celery_app)


def queue_depth(name: str) -> int:
    """Return the number of ready messages in a queue of this namespace."""
    with celery_app.connection_for_write() as conn:
        queue = celery_app.amqp.queues[name]
        _, count, _ = cast("tuple[str, int, int]", queue(conn.channel()).queue_declare(passive=True))
        return int(count)


@pytest.fixture(scope="session", autouse=True)
def _broker_vhost(request: pytest.FixtureRequest) -> None:
    """Create this namespace's vhost once a session, unless every test selected is pure."""
    if not all(item.get_closest_marker("pure") for item in request.session.items):
        _ensure_vhost()


_KEPT_BY_FLUSH = {"django_content_type", "auth_permission"}


@pytest.fixture(scope="session", autouse=True)
def _transactional_tests_flush_by_delete() -> Iterator[None]:
    """Have a transactional test's teardown empty the tables with DELETE, not TRUNCATE; drop the database by force.

    What such a test leaves is a few rows, not a table. TRUNCATE gives each table and index new files: 0.4 to 0.8 s
    per test on this machine, where a DELETE of every table takes about 0.02 s. The foreign keys are deferred
    (Django makes them DEFERRABLE INITIALLY DEFERRED), so the order does not matter. Content types and permissions
    stay (no test makes or removes one), so the post_migrate signal after the flush finds them all and writes
    nothing. A flush that resets sequences keeps Django's TRUNCATE.
    """
    from django.db.backends.postgresql.creation import DatabaseCreation
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def delete(
        self: DatabaseOperations, style: Any, tables: list[str], *, reset_sequences: bool = False, **kwargs: Any
    ) -> list[str]:
        if reset_sequences or not tables:
            return list(truncate(self, style, tables, reset_sequences=reset_sequences, **kwargs))
        return [f"DELETE FROM {self.quote_name(table)}" for table in tables if table not in _KEPT_BY_FLUSH]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "sql_flush", delete)
        patch.setattr(DatabaseCreation, "_destroy_test_db", _drop_test_database_with_force)
        yield


def _drop_test_database_with_force(self: Any, test_database_name: str, verbosity: int) -> None:
    """Drop the test database even while a thread of this process still holds a connection to it.

    A background thread (the publisher, the lease heartbeat) keeps its own connection, which Django does not close;
    a plain DROP DATABASE then waits 5 s for it and gives up with a warning, at the end of every pytest process.
    """
    self.connection.close_pool()
    with self._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE {self.connection.ops.quote_name(test_database_name)} WITH (FORCE)")


@pytest.fixture(autouse=True)
def _clean_redis(request: pytest.FixtureRequest) -> Iterator[None]:
    """Clear this namespace's Redis keys (pure tests have none), the process's caches and its guards' outages.

    The configuration generation lives in Redis: with its key gone every test starts at generation 0, and an entry
    that a test before it cached at 0 (its template, its client) would look current to the next one.
    """
    from core.config_cache import forget_all
    from core.redis_guard import redis_guards_retry
    from tests.redis_server import delete_namespace_keys

    if not request.node.get_closest_marker("pure"):
        delete_namespace_keys(settings.REDIS_URL, REDIS_PREFIX)
    forget_all()
    # A test before this one may have pointed Redis at a dead port: the guards it degraded (the API's rate limit
    # among them) would serve their per-process fallbacks for seconds into this test.
    redis_guards_retry()
    yield


@pytest.fixture(scope="session")
def django_db_modify_db_settings_xdist_suffix() -> None:
    """Leave the test database's name alone under pytest-xdist: the worker's namespace already names it."""


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None, django_db_blocker: Any) -> None:
    """Create the test database as a copy of the migrated template, built once (tests/testdb.py)."""
    with django_db_blocker.unblock():
        use_migrated_template()


_ZYGOTE: list[Zygote | None] = []


def _zygote() -> Zygote | None:
    """Return this process's zygote (tests/zygote.py), started on first use; None where it is off or failed."""
    if not _ZYGOTE:
        zygote = None
        if os.environ.get("NOTIFIER_TEST_ZYGOTE", "1") != "0":
            base_env = {
                **os.environ,
                "CELERY_BROKER_URL": BROKER_URL,
                "DATABASE_URL": test_database_url(),
                "REDIS_KEY_PREFIX": REDIS_PREFIX,
            }
            zygote = Zygote(ROOT / "var" / f"zygote-{NS}-{os.getpid()}", base_env)
            if not zygote.ready():
                zygote.stop()
                zygote = None
        _ZYGOTE.append(zygote)
    return _ZYGOTE[0]


@pytest.fixture(scope="session", autouse=True)
def _stop_the_zygote() -> Iterator[None]:
    """Stop this process's zygote, if a test started one, when the session ends."""
    yield
    if _ZYGOTE and _ZYGOTE[0] is not None:
        _ZYGOTE[0].stop()


# The servers started from the zygote (tests/zygote.py) when their environment allows it; anything else cold.
ZYGOTE_MODULES = ("celery", "gunicorn", "uvicorn")


class ServerProcess:
    """A real process of this project (Celery worker or beat, gunicorn, uvicorn) started by a test.

    The one place tests start them: `python -m <args>` in the repository (or in `cwd`, another release's tree),
    on this namespace's broker, test database and Redis prefix (`env` adds or overrides variables), logging to
    var/, in a session of its own so that stopping it stops its children too.
    """

    def __init__(self, kind: str, args: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> None:
        self.kind = kind
        self.log_path = ROOT / "var" / f"test-{kind}-{NS}-{os.getpid()}-{time.monotonic_ns()}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        full_env = {
            **os.environ,
            "CELERY_BROKER_URL": BROKER_URL,
            "DATABASE_URL": test_database_url(),
            "REDIS_KEY_PREFIX": REDIS_PREFIX,
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self._log = self.log_path.open("w")
        self._terminated = False
        warm = args[0] in ZYGOTE_MODULES and cwd == ROOT and not changes_import_time_env(env or {})
        zygote = _zygote() if warm else None
        forked = None
        if zygote is not None:
            with contextlib.suppress(OSError):  # the zygote is gone: a cold start costs a second of CPU, no more
                forked = zygote.spawn(args, full_env, cwd, self.log_path)
        self.proc: subprocess.Popen[bytes] | ForkedProcess = forked or subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=cwd, env=full_env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def wait_ready(self, ready: str | Callable[[], bool] = "ready.", timeout: float = 60) -> None:
        """Block until the process logs `ready` (or `ready()` is true); fail if it exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited early:\n{self.log()[-4000:]}")
            if (ready in self.log()) if isinstance(ready, str) else ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{self.kind} not ready:\n{self.log()[-4000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the process's whole group (the main process and its children)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # ended (not yet reaped) since the poll
                os.killpg(self.proc.pid, sig)

    def terminate(self) -> None:
        """Begin a warm stop (SIGTERM, once) without waiting for it: `stop` waits."""
        if self.proc.poll() is None and not self._terminated:
            self._terminated = True
            self.kill(signal.SIGTERM)

    def stop(self) -> None:
        """Stop the process warmly, then coldly if it does not exit."""
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill(signal.SIGKILL)
                self.proc.wait(timeout=10)
        if not self._log.closed:
            self._log.close()

    def log(self) -> str:
        """Return what the process has logged so far."""
        return self.log_path.read_text()


# A Celery worker is a ServerProcess; the name stays for the tests that annotate with it.
WorkerProcess = ServerProcess
ALL_SEND_QUEUES = [f"{c}.{p}" for c in CHANNELS for p in ("high", "low")]


@pytest.fixture
def start_process() -> Iterator[Callable[..., ServerProcess]]:
    """Start real processes of this project for a test (see ServerProcess); all are stopped afterwards."""
    started: list[ServerProcess] = []

    def _start(kind: str, args: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> ServerProcess:
        process = ServerProcess(kind, args, env, cwd)
        started.append(process)
        return process

    yield _start
    # The test is over: what it checks does not depend on how its processes end, and a warm stop costs each test
    # about a second (a Celery worker's shutdown, gunicorn's graceful stop; five for a stream server with streams
    # open). A test that is about stopping stops its processes itself. What a killed worker held unacknowledged
    # goes back to its queue, which the next test's workers purge before they start (`start_worker`).
    for process in started:
        process.kill()
    for process in started:
        process.stop()


@pytest.fixture
def start_worker(start_process: Callable[..., ServerProcess]) -> Callable[..., ServerProcess]:
    """Start real Celery workers for a test (queues purged first); all of them are stopped afterwards."""
    purge_all_queues()

    def _start(
        queues: list[str] | None = None,
        env: dict[str, str] | None = None,
        concurrency: int = 2,
        pool: str = "prefork",
        wait: bool = True,
        cwd: Path = ROOT,
        name: str = "",
    ) -> ServerProcess:
        args = [
            "celery", "-A", "config", "worker", "-Q", ",".join(queues or [*ALL_SEND_QUEUES, "fanout", "maintenance"]),
            "--pool", pool, "--concurrency", str(concurrency), "--loglevel", "INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", name or f"test-{NS}-{time.monotonic_ns()}@%h",
        ]  # fmt: skip
        # Celery's per-task lines are off by default (config/ops_settings.py); tests wait for "succeeded" lines.
        env = {"OUTBOX_RELAY_INTERVAL_SECONDS": "3600", "CELERY_TASK_LOGS": "true", **(env or {})}
        worker = start_process("worker", args, env, cwd)
        if wait:
            worker.wait_ready()
        return worker

    return _start


class HandClock:
    """A monotonic clock that a test moves by hand (`clock.now += 1`)."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def free_port() -> int:
    """Return a loopback TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def two_api_processes(start_process: Callable[..., Any]) -> list[str]:
    """Two real gunicorn processes (one worker each) on loopback ports, on the test database and Redis prefix."""
    urls = []
    for _ in range(2):
        port = free_port()
        args = ["gunicorn", "config.wsgi:application", "-b", f"127.0.0.1:{port}", "-w", "1"]
        start_process("api", args, {"LOG_LEVEL": "WARNING"})
        urls.append(f"http://127.0.0.1:{port}")

    def up(url: str) -> bool:
        try:
            return bool(urllib.request.urlopen(f"{url}/healthz", timeout=1).status == 200)
        except OSError:
            return False

    for url in urls:
        wait_for(functools.partial(up, url), timeout=60)
    return urls


def at_once(n: int, call: Callable[[], T]) -> list[T]:
    """Run `call` on `n` threads released together; return what each returned (each closes its connections).

    Every thread holds a PostgreSQL connection of its own and the server allows 100: two such bursts from two
    pytest workers beside the rest of the suite's processes exceeded it ("sorry, too many clients already", the
    test then saw a 503). A burst takes a lock shared by the run's workers, so no two overlap.
    """
    from django.db import connections

    barrier = threading.Barrier(n)
    results: list[T] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            barrier.wait()
            result = call()
            with lock:
                results.append(result)
        finally:
            connections.close_all()

    lock_path = ROOT / "var" / f"bursts-{settings.TEST_NAMESPACE}.lock"
    lock_path.parent.mkdir(exist_ok=True)
    with lock_path.open("a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        threads = [threading.Thread(target=one) for _ in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(results) == n, f"{n - len(results)} of {n} calls raised (their tracebacks are above)"
    return results


def wait_for(predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.2) -> Any:
    """Poll `predicate` until it returns a truthy value; fail the test if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def bearer_client(raw_key: str) -> Any:
    """Return a DRF test client that sends `raw_key` as its Bearer API key."""
    from rest_framework.test import APIClient

    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return http


@pytest.fixture
def api_client_factory(db: None) -> Callable[..., tuple[Any, Any]]:
    """Return a factory of (ApiClient, authenticated DRF test client) pairs (every scope unless told)."""
    from core.scopes import SCOPES
    from notifier.clients.services import api_client_create

    counter = {"n": 0}

    def _make(
        name: str | None = None,
        categories: list[str] | None = None,
        scopes: list[str] | None = None,
        *,
        project: str = "default",
        mode: str = "live",
    ) -> tuple[Any, Any]:
        counter["n"] += 1
        # Every scope unless a test narrows it: tests of an endpoint are not about scopes (test_scopes.py is).
        client, raw_key = api_client_create(
            name=name or f"svc-{counter['n']}",
            allowed_categories=categories or [],
            scopes=list(SCOPES) if scopes is None else scopes,
            project=project,
            mode=mode,
        )
        return client, bearer_client(raw_key)

    return _make


@pytest.fixture
def service_and_api(api_client_factory: Callable[..., tuple[Any, Any]]) -> tuple[Any, Any]:
    """Return a fresh API client with every category and scope, and a DRF test client authenticated as it."""
    return api_client_factory()


@pytest.fixture
def service(service_and_api: tuple[Any, Any]) -> Any:
    """Return the API client row (notifier.models.ApiClient) that `api` is authenticated as."""
    return service_and_api[0]


@pytest.fixture
def api(service_and_api: tuple[Any, Any]) -> Any:
    """Return a DRF test client authenticated as `service` (every category and scope)."""
    return service_and_api[1]


@pytest.fixture
def staff(request: pytest.FixtureRequest, db: None) -> Any:
    """Return Django's test client logged in as a superuser, named by the module's `staff_user` marker ("staff")."""
    from django.test import Client

    from tests.factories import make_staff_user

    marker = request.node.get_closest_marker("staff_user")
    client = Client()
    client.force_login(make_staff_user(marker.args[0] if marker else "staff", superuser=True))
    return client
