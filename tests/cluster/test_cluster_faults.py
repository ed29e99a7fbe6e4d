"""Faults of replicated engines under load: a RabbitMQ node killed, a broker node hung, a broker node cut off
its peers by the network, the PostgreSQL primary lost and its standby promoted, the PostgreSQL primary silenced by
the network (its standby promoted, then the old primary back as a standby), the Redis master killed and a replica
promoted by Sentinel, the Redis master silenced by the network.

The whole stack runs against real clusters on loopback (tests/cluster/servers.py; for the network partition the
broker nodes, PostgreSQL and Redis's master and replica run in network namespaces of their own,
tests/cluster/netns.py, and the silent primary and silent Redis master share that stack), configured as a deployment
is: the broker failover list in CELERY_BROKER_URL, a multi-host DATABASE_URL with target_session_attrs, Redis
through REDIS_SENTINELS. The API is gunicorn, the workers and beat real Celery processes, the provider the
webhook stand-in receiver (which records every call and the delivery it carried). Under each fault a topic
fan-out, a stream of transactional singles and a stream of security OTPs go through the API at once.

After each fault: every accepted delivery is `sent`, reached the receiver, the last of them within 60 s of the
dependency's return; a delivery reached the receiver twice only if it was `sending` when the fault struck (the
calls in flight); the API answered throughout (no error at all while the database stays up; while it has no
primary only quick 503s); `/readyz` named the dependency as down or degraded while it was. Every request is also
matched by its dedup_key to its deliveries (none lost, none sent twice unless in flight, none unasked for). The
figures of each fault (accepted, delivered, sent twice, API errors, longest gap, OTP p99) are printed
(docs/cluster.md).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.cluster.netns import NetLab
from tests.cluster.servers import (
    PgPair,
    PgServer,
    RabbitCluster,
    RabbitNode,
    RedisNode,
    RedisSentinelSet,
    answers_ok,
    missing_requirements,
)
from tests.conftest import NS, ROOT, ServerProcess
from tests.inbox.test_inbox_browser import SseReader
from tests.redis_server import free_port
from tests.stubs.config import WEBHOOK_SECRET
from tests.stubs.webhook import TimedReceiver

# Serial: three clusters, the service and a load generator take the whole machine.
pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.slow, pytest.mark.serial]

FANOUT = 1500  # subscribers of the topic sent to under every fault
SINGLES_PER_SECOND = 8
OTPS_PER_SECOND = 2
DELIVERY_BOUND = 60.0  # seconds after the dependency's return by which every accepted delivery is sent
# The network partition: broker nodes in network namespaces, a peer silent for about NETNS_TICKTIME seconds is down.
NETNS_TICKTIME = 4
SLOW_RATE = "4mbit"  # while cut, what still flows leaves every broker node at this rate at most
OTP_P99_BOUND = 2.0  # seconds from accept to the provider for OTPs while a quorum of broker nodes remains
# The hung primary: its standby promoted this long after the primary went silent (a managed failover's detection).
HUNG_PROMOTE_AFTER = 10.0
# No call waits longer for its answer while the primary is silent. A statement sent to it fails after
# tcp_user_timeout (10 s); the API's accepts of one process queue behind the write in flight (group commit), so
# a call that arrived meanwhile waits that out, then its own connection gives up on the silent host, first in the
# list, after connect_timeout (3 s) and finds the promoted standby; the process's next connections go to that one
# first (core/postgresql/base.py). And 4 s for a loaded box (measured: 13.6 and 13.7 s at most).
HUNG_ANSWER_BOUND = 17.0
HUNG_CLIENT_TIMEOUT = 30.0  # the load waits this long for an answer (gunicorn's own timeout): longer calls show
# The Redis master silenced: the API's client is on the promoted replica this soon after the promotion (a command
# on the silent master fails after socket_timeout, 0.5 s; the guard retries Redis every 5 s; a new connection asks
# the Sentinels for the master).
REDIS_NOTICE_BOUND = 10.0
# The API accepts, and the workers send, again this soon after the promotion (a call made after it answered 202, a
# delivery reached the receiver): what a call may wait (HUNG_ANSWER_BOUND) less the 10 s before the promotion, and 5 s
# (measured: 3.6 s).
HUNG_ACCEPTING_BOUND = 12.0


@dataclass
class Stack:
    """The clusters, the stand-in receiver and the service's processes on them."""

    rabbit: RabbitCluster
    pg: PgPair
    redis: RedisSentinelSet
    receiver: TimedReceiver
    api: str
    key: str
    processes: list[ServerProcess]
    stream_port: int
    loads: list[Load] = field(default_factory=list)  # every fault run's load, the latest last (its calls)
    answer_within: float = 10.0  # the load's HTTP timeout: a call not answered by then has status 0

    def sql(self, query: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a query on the service's database, wherever its primary is now (as the service finds it)."""
        hosts = f"{self.pg.primary.host},{self.pg.standby.host}"
        ports = f"{self.pg.primary.port},{self.pg.standby.port}"
        dsn = f"host={hosts} port={ports} user=postgres dbname={self.pg.dbname} connect_timeout=3"
        with psycopg.connect(dsn + " target_session_attrs=read-write", autocommit=True) as conn:
            return conn.execute(query, params or []).fetchall()


def _service_env(rabbit: RabbitCluster, pg: PgPair, rs: RedisSentinelSet) -> dict[str, str]:
    return {
        "CELERY_BROKER_URL": rabbit.urls,
        "DATABASE_URL": pg.url(),
        # Only its database number counts once REDIS_SENTINELS is set: the master comes from the Sentinels.
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "REDIS_SENTINELS": rs.sentinel_list,
        "REDIS_SENTINEL_MASTER": rs.MASTER_NAME,
        "REDIS_KEY_PREFIX": f"notifier-cluster:{NS}:",
        "WEBHOOK_SIGNING_SECRET": WEBHOOK_SECRET,
        "WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
        "WEBHOOK_PROVIDERS": "webhook",
        "PROVIDER_RATE_LIMITS": "{}",
        # The receiver never fails: no breaker opens because a dependency of ours went away.
        "PROVIDER_CIRCUIT_BREAKERS": json.dumps({"webhook": {"min_calls": 100_000}}),
        "API_CLIENT_RATE_LIMIT": "10000/s",
        # The recovery and retry settings are the shipped defaults (lease 30 s renewed every 10 s, relay every 5 s,
        # republish after 40 s, fan-out stall 30 s with a sweep every 10 s, retries from 2 s doubling up to 600 s):
        # production runs what this bounds at 60 s.
        "DEVELOPMENT": "true",
        "WEB_WORKERS": "1",
        "WEB_THREADS": "8",
    }


def _manage(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    result = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Start the three clusters and the service on them; tear every process and directory down afterwards."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    root = _cluster_root()
    with _running_stack(root, RabbitCluster(root, f"notifier-{NS}-")) as running:
        yield running


@pytest.fixture(scope="module")
def partitionable_stack() -> Iterator[tuple[Stack, NetLab]]:
    """Start the stack with each broker node in a network namespace of its own; remove them all afterwards.

    The nodes are on a bridge (tests/cluster/netns.py), named by address, with NETNS_TICKTIME. The API, the
    high-priority worker and beat start their failover lists at node 1; the bulk worker (fan-out, webhook.low,
    maintenance) at node 3, the side the partition cuts off. Module-scoped: the scenarios on namespaces share one
    stack (each leaves it whole again); the namespaces exist only while they run.
    """
    reason = missing_requirements() or next(
        (f"{tool} is not installed" for tool in ("ip", "tc") if shutil.which(tool) is None), None
    )
    if reason:
        pytest.skip(reason)
    root = _cluster_root()
    lab = NetLab(NS)
    try:
        lab.start()
        rabbit = RabbitCluster(root, f"notifier-{NS}-", lab=lab, net_ticktime=NETNS_TICKTIME)
        with _running_stack(root, rabbit, {"bulk": rabbit.nodes[2]}, lab) as running:
            yield running, lab
    finally:
        lab.close()


def _cluster_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix=f"notifier-cluster-{NS}-"))
    root.chmod(0o755)  # the rabbitmq and postgres users keep their directories under it
    return root


@contextlib.contextmanager
def _running_stack(
    root: Path, rabbit: RabbitCluster, first_node: dict[str, RabbitNode] | None = None, lab: NetLab | None = None
) -> Iterator[Stack]:
    """Start Redis, PostgreSQL, `rabbit` and the service on them; stop every process, remove `root` afterwards.

    `first_node` places a process (by kind: api, high, bulk, beat) on a broker node: its failover list starts
    there (the others start at the first node). With `lab`, PostgreSQL's two servers and Redis's master and replica
    run in namespaces of it.
    """
    pg = PgPair(root, "notifier", lab)
    rs = RedisSentinelSet(root, lab)
    processes: list[ServerProcess] = []
    started = time.monotonic()
    with TimedReceiver() as receiver:
        try:
            # The broker nodes boot while Redis and PostgreSQL start and the schema and data are written (neither
            # needs the broker); then they are joined.
            rabbit.boot()
            rs.start()
            pg.start()
            env = _service_env(rabbit, pg, rs)
            _manage(env, "manage.py", "migrate", "--noinput", "-v0")
            key = json.loads(_manage(env, "-m", "tests.cluster.seed", receiver.url, str(FANOUT)))["key"]
            rabbit.start()
            print(f"\nclusters up in {time.monotonic() - started:.0f}s (RabbitMQ {rabbit.urls})")

            def placed(kind: str) -> dict[str, str]:
                first = (first_node or {}).get(kind, rabbit.nodes[0])
                return {**env, "CELERY_BROKER_URL": rabbit.urls_from(first)}

            port = free_port()
            processes.append(
                ServerProcess("cluster-api", ["gunicorn", "-c", "gunicorn.conf.py", "-b", f"127.0.0.1:{port}",
                                              "config.wsgi"], placed("api"))
            )  # fmt: skip
            # The high worker sends in-app too: the inbox stream's check sends one transactional alert.
            for name, queues in (("high", "webhook.high,inapp.high"), ("bulk", "webhook.low,fanout,maintenance")):
                processes.append(
                    ServerProcess(f"cluster-{name}", [
                        "celery", "-A", "config", "worker", "-Q", queues, "--pool", "threads", "--concurrency", "4",
                        "--loglevel", "INFO", "--without-gossip", "--without-mingle", "-n", f"cluster-{NS}-{name}@%h",
                    ], placed(name))
                )  # fmt: skip
            processes.append(
                ServerProcess("cluster-beat", ["celery", "-A", "config", "beat", "--loglevel", "INFO",
                                               "-s", str(root / "beat-schedule")], placed("beat"))
            )  # fmt: skip
            # The inbox stream server, as the Procfile runs it: its LISTEN connection goes where DATABASE_URL's
            # read-write host is.
            stream_port = free_port()
            processes.append(
                ServerProcess("cluster-stream", ["uvicorn", "config.asgi:application", "--host", "127.0.0.1",
                                                 "--port", str(stream_port), "--no-access-log"], placed("api"))
            )  # fmt: skip
            api = f"http://127.0.0.1:{port}"
            processes[0].wait_ready(lambda: answers_ok(f"{api}/healthz"), timeout=60)
            for worker in processes[1:3]:
                worker.wait_ready()
            processes[-1].wait_ready("Application startup complete", timeout=60)
            print(f"stack up in {time.monotonic() - started:.0f}s")
            yield Stack(rabbit, pg, rs, receiver, api, key, processes, stream_port)
        finally:
            for process in processes:
                process.kill()  # disposable, like the clusters they ran on: no warm shutdown to wait for
                process.stop()
            rabbit.stop()
            pg.stop()
            rs.stop()
            shutil.rmtree(root, ignore_errors=True)


# --- load and figures -------------------------------------------------------------------------------------------


@dataclass
class Call:
    """One accept request: its dedup_key, when it started and ended, and what it answered (0 for no answer)."""

    kind: str
    dedup_key: str
    started: float
    ended: float
    status: int


@dataclass
class Load:
    """Singles and OTPs through the API at a steady rate from their own threads, every call recorded."""

    stack: Stack
    tag: str
    calls: list[Call] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        """Start the two streams (and list this load on the stack: a scenario may read its calls)."""
        self.stack.loads.append(self)
        for kind, template, user, rate in (
            ("single", "receipt", "single", SINGLES_PER_SECOND),
            ("otp", "otp", "otp", OTPS_PER_SECOND),
        ):
            thread = threading.Thread(target=self._stream, args=(kind, template, user, rate), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop the streams and wait for their last calls."""
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def post(self, http: httpx.Client, kind: str, body: dict[str, Any]) -> int:
        """POST one notification; record it; return the status (0 when no answer came)."""
        started = time.time()
        try:
            status = http.post("/api/v1/notifications", json=body).status_code
        except httpx.HTTPError:
            status = 0
        self.calls.append(Call(kind, body["dedup_key"], started, time.time(), status))
        return status

    def client(self) -> httpx.Client:
        """Return an HTTP client of the API with the load's key (10 s to answer unless the stack says otherwise)."""
        return httpx.Client(
            base_url=self.stack.api,
            headers={"Authorization": f"Bearer {self.stack.key}"},
            timeout=self.stack.answer_within,
        )

    def _stream(self, kind: str, template: str, user: str, rate: float) -> None:
        with self.client() as http:
            n = 0
            next_at = time.monotonic()
            while not self.stopping.is_set():
                n += 1
                body = {
                    "recipient": {"user_id": user}, "template": template, "channels": ["webhook"],
                    "payload": {"ref": f"{self.tag}-{kind}-{n}"}, "dedup_key": f"{self.tag}-{kind}-{n}",
                }  # fmt: skip
                self.post(http, kind, body)
                next_at += 1 / rate
                time.sleep(max(0.0, next_at - time.monotonic()))


@dataclass
class Probe:
    """/readyz polled once a second from its own thread: (time, status code, body)."""

    url: str
    samples: list[tuple[float, int, dict[str, Any]]] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            started = time.time()
            try:
                response = httpx.get(self.url, timeout=10)
                self.samples.append((started, response.status_code, response.json()))
            except (httpx.HTTPError, ValueError):
                self.samples.append((started, 0, {}))
            self.stopping.wait(1.0)

    def stop(self) -> None:
        """Stop polling."""
        self.stopping.set()
        self.thread.join(timeout=15)

    def flagged(self, dependency: str, since: float, until: float) -> list[str]:
        """Return how /readyz reported `dependency` in [since, until]: "down", "degraded" or "ok" per sample."""
        seen = []
        for at, _, body in self.samples:
            if since <= at <= until:
                check = body.get("checks", {}).get(dependency, {})
                seen.append("down" if not check.get("ok") else "degraded" if check.get("degraded") else "ok")
        return seen


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] if ordered else float("nan")


def _longest_gap(calls: list[Call], since: float, until: float) -> float:
    """Return the longest time in [since, until] without a successful accept answered."""
    answered = sorted(c.ended for c in calls if c.status in (200, 202))
    points = [since, *[t for t in answered if since <= t <= until], until]
    return max(b - a for a, b in itertools.pairwise(points))


@dataclass
class Fault:
    """What one fault run measured."""

    name: str
    t_fault: float
    t_back: float
    accepted: int
    delivered: int
    sent_twice: int
    in_flight: int
    api_calls: int
    api_errors: Counter[int]
    worst_errors_per_second: int
    longest_gap: float
    otp_p99: float
    otp_p50: float
    otp_count: int
    otp_slow: int
    otp_slowest: list[str]
    last_after_back: float
    readyz: list[str]
    accounting: Accounting

    def report(self) -> str:
        """Return the figures as one line (docs/cluster.md copies them)."""
        errors = sum(self.api_errors.values())
        return (
            f"{self.name}: accepted {self.accepted}, delivered {self.delivered}, sent twice {self.sent_twice} "
            f"(in flight at the fault {self.in_flight}), API calls {self.api_calls}, errors {errors} "
            f"{dict(self.api_errors)} (worst {self.worst_errors_per_second}/s), longest gap {self.longest_gap:.1f}s, "
            f"OTP p99 {self.otp_p99:.2f}s (p50 {self.otp_p50:.2f}s, {self.otp_slow} of {self.otp_count} over 5 s), "
            f"slowest OTPs (after the fault: accepted, published, claimed, at the receiver) {self.otp_slowest}; "
            f"last delivery {self.last_after_back:.1f}s after the return; "
            f"readyz {Counter(self.readyz)}; {self.accounting.report()}"
        )


@dataclass
class Accounting:
    """Every request of a fault run matched, by its dedup_key, to the deliveries it made and what reached the receiver.

    `accepted` are the keys answered 202; `unanswered` the others (an error or no answer: the request may still
    have been kept, and then it is held to the same rules). A key is lost when it was accepted and has no delivery,
    fewer than it should (one per single or OTP, the whole topic for the fan-out), or a delivery that never reached
    the receiver. Sent twice: deliveries the receiver got more than once, and of those the ones not `sending` when
    the fault struck (the only ones a second call is allowed for). Orphans: deliveries of the run no key made.
    """

    accepted: int
    unanswered: int
    unanswered_kept: int
    matched: int
    deliveries: int
    lost: list[str]
    sent_twice: int
    twice_not_in_flight: list[int]
    orphans: int

    def report(self) -> str:
        """Return the accounting as one line."""
        return (
            f"by dedup_key: {self.accepted} accepted, {self.matched} matched to their {self.deliveries} deliveries, "
            f"lost {len(self.lost)}, sent twice {self.sent_twice} (not in flight at the fault "
            f"{len(self.twice_not_in_flight)}), unanswered {self.unanswered} (kept {self.unanswered_kept}), "
            f"orphan deliveries {self.orphans}"
        )


def _account(
    stack: Stack, calls: list[Call], since: Any, ok: Counter[int], in_flight: set[int], run_ids: set[int]
) -> Accounting:
    """Match every call's dedup_key to its notification's deliveries and to the receiver's calls (see Accounting)."""
    rows = stack.sql(
        "SELECT n.dedup_key, d.id FROM notifier_notification n JOIN notifier_delivery d ON d.notification_id = n.id"
        " WHERE n.created_at >= %s AND n.dedup_key = ANY(%s)",
        [since, [c.dedup_key for c in calls]],
    )
    deliveries: dict[str, list[int]] = {}
    for dedup_key, delivery_id in rows:
        deliveries.setdefault(dedup_key, []).append(delivery_id)
    expected = {c.dedup_key: FANOUT if c.kind == "topic" else 1 for c in calls}
    accepted = {c.dedup_key for c in calls if c.status == 202}
    kept = {k for k in deliveries if k not in accepted}
    lost = [
        k
        for k in sorted(accepted | kept)
        if len(deliveries.get(k, [])) != expected[k] or any(ok[d] == 0 for d in deliveries.get(k, []))
    ]
    made = {d for ids in deliveries.values() for d in ids}
    twice = {d for d in made if ok[d] > 1}
    return Accounting(
        accepted=len(accepted),
        unanswered=len(calls) - len(accepted),
        unanswered_kept=len(kept),
        matched=sum(1 for k in accepted if k in deliveries),
        deliveries=len(made),
        lost=lost,
        sent_twice=len(twice),
        twice_not_in_flight=sorted(twice - in_flight),
        orphans=len(run_ids - made),
    )


def run_fault(
    stack: Stack, name: str, dependency: str, inject: Callable[[], None], restore: Callable[[], float]
) -> Fault:
    """Run the load, inject the fault mid fan-out, restore; wait for every delivery; return the figures.

    `restore` brings the dependency back and returns the wall-clock time it was back (serving again).
    """
    since = time.time()
    phase_started = stack.sql("SELECT now()")[0][0]
    probe = Probe(f"{stack.api}/readyz")
    load = Load(stack, f"{name}-{int(since)}").start()
    try:
        with load.client() as http:
            body = {"topic": "everyone", "template": "news", "channels": ["webhook"], "payload": {"ref": name},
                    "dedup_key": f"{name}-{int(since)}-topic"}  # fmt: skip
            assert load.post(http, "topic", body) == 202
        fan_sql = (
            "SELECT count(*) FROM notifier_delivery d JOIN preferences_recipient r ON r.id = d.recipient_id"
            " WHERE d.created_at >= %s AND r.user_id LIKE 'fan-%%'"
        )
        fan_sent = lambda: stack.sql(fan_sql + " AND d.status = 'sent'", [phase_started])[0][0]  # noqa: E731
        _until(lambda: fan_sent() >= FANOUT // 4, f"{name}: a quarter of the fan-out delivered before the fault", 90)
        in_flight = {row[0] for row in stack.sql("SELECT id FROM notifier_delivery WHERE status = 'sending'")}
        t_fault = time.time()
        inject()
        t_back = restore()
        time.sleep(5)  # load keeps coming after the return too
    except BaseException:
        probe.stop()
        raise
    finally:
        # Also when the fault could not be injected or restored: a load left running would post into the next
        # scenarios (their rows would never settle).
        load.stop()
    t_end = time.time()

    def settled() -> bool:
        rows = stack.sql("SELECT count(*) FROM notifier_delivery WHERE status IN ('queued', 'sending', 'deferred')")
        # The whole fan-out written too: a fan-out task still waiting in its queue has no rows to count yet.
        return rows[0][0] == 0 and stack.sql(fan_sql, [phase_started])[0][0] == FANOUT

    try:
        _until(settled, f"{name}: nothing left queued or sending", DELIVERY_BOUND + 30)
    except AssertionError:
        left = stack.sql(
            "SELECT status, attempts, left(last_error, 120), published_at IS NOT NULL, claimed_at IS NOT NULL, count(*)"
            " FROM notifier_delivery WHERE status IN ('queued', 'sending', 'deferred') GROUP BY 1, 2, 3, 4, 5"
        )
        raise AssertionError(
            f"{name}: left unsent (status, attempts, error, published, claimed, n): {left}; {_last_words(stack)}"
        ) from None
    probe.stop()

    rows = stack.sql(
        "SELECT d.id, d.status, r.user_id, extract(epoch FROM d.created_at), extract(epoch FROM d.published_at),"
        " extract(epoch FROM d.claimed_at) FROM notifier_delivery d"
        " JOIN preferences_recipient r ON r.id = d.recipient_id WHERE d.created_at >= %s",
        [phase_started],
    )
    ids = {row[0] for row in rows}
    statuses = Counter(row[1] for row in rows)
    hits = [h for h in stack.receiver.snapshot() if h.delivery_id in ids and h.status == 200]
    ok = Counter(h.delivery_id for h in hits)
    first_hit: dict[int, float] = {}
    for hit in hits:
        first_hit.setdefault(hit.delivery_id, hit.at)
    twice = {i for i, n in ok.items() if n > 1}
    otp_rows = sorted(
        (row for row in rows if row[2] == "otp" and t_fault <= float(row[3]) <= t_back + 5 and row[0] in first_hit),
        key=lambda row: first_hit[row[0]] - float(row[3]),
    )
    otp_latency = [first_hit[row[0]] - float(row[3]) for row in otp_rows]
    # Where the slowest OTPs waited: for the publish (an election, a reconnect) or for a consumer.
    slowest = otp_rows[-3:]
    since_fault = lambda at: "-" if at is None else f"{float(at) - t_fault:.2f}"  # noqa: E731
    otp_slowest = ["/".join(since_fault(at) for at in (row[3], row[4], row[5], first_hit[row[0]])) for row in slowest]
    calls = [c for c in load.calls if c.kind != "topic"]
    errors = Counter(c.status for c in calls if c.status not in (200, 202))
    per_second = Counter(int(c.started) for c in calls if c.status not in (200, 202))
    fault = Fault(
        name=name,
        t_fault=t_fault,
        t_back=t_back,
        accepted=len(ids),
        delivered=len(ok),
        sent_twice=len(twice),
        in_flight=len(in_flight),
        api_calls=len(calls),
        api_errors=errors,
        worst_errors_per_second=max(per_second.values(), default=0),
        longest_gap=_longest_gap(calls, since, t_end),
        otp_p99=_p99(otp_latency),
        otp_p50=sorted(otp_latency)[len(otp_latency) // 2] if otp_latency else float("nan"),
        otp_count=len(otp_latency),
        otp_slow=sum(1 for latency in otp_latency if latency > 5),
        otp_slowest=otp_slowest,
        last_after_back=max(first_hit.values(), default=t_back) - t_back,
        readyz=probe.flagged(dependency, t_fault, t_back),
        accounting=_account(stack, load.calls, phase_started, ok, in_flight, ids),
    )
    print(f"\n{fault.report()}")

    # Every accepted notification: one delivery row per 202 (the three streams), each sent and received.
    accepted_calls = Counter(c.kind for c in load.calls if c.status == 202)
    by_kind = Counter(_kind(row[2]) for row in rows)
    assert by_kind["topic"] == FANOUT * accepted_calls["topic"], by_kind
    assert by_kind["single"] >= accepted_calls["single"] and by_kind["otp"] >= accepted_calls["otp"], (
        by_kind,
        accepted_calls,
    )
    assert statuses == {"sent": len(ids)}, statuses
    assert set(ok) == ids, f"{len(ids - set(ok))} accepted deliveries never reached the receiver"
    # A second call only for what was on the wire when the fault struck.
    assert twice <= in_flight, f"sent twice and not in flight at the fault: {sorted(twice - in_flight)[:20]}"
    # The same, request by request: each kept dedup_key has all its deliveries, each received; no delivery of the
    # run that no request made.
    account = fault.accounting
    assert not account.lost and not account.twice_not_in_flight and not account.orphans, account
    assert account.matched == account.accepted == accepted_calls.total(), account
    assert fault.last_after_back <= DELIVERY_BOUND, fault.report()
    assert _stuck(stack) == 0
    return fault


def _last_words(stack: Stack) -> str:
    """Return each service process's state and last log line: why a queue was left without a consumer, say."""
    words = []
    for process in stack.processes:
        code = process.proc.poll()
        lines = process.log().strip().splitlines() or [""]
        words.append(f"{process.kind} {'running' if code is None else f'exited {code}'}: {lines[-1][:300]}")
    return " | ".join(words)


def _kind(user_id: str) -> str:
    return "topic" if user_id.startswith("fan-") else user_id


def _stuck(stack: Stack) -> int:
    return int(stack.sql("SELECT count(*) FROM notifier_delivery WHERE status IN ('queued', 'sending')")[0][0])


def _until(predicate: Callable[[], Any], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except psycopg.OperationalError:
            pass  # the database itself may be the fault
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout:.0f}s: {what}")


def _client_node(rabbit: RabbitCluster, via: RabbitNode) -> Counter[str]:
    """Return how many client connections each node holds (by the address and port each one came in on)."""
    rows = json.loads(via.ctl("list_connections", "host", "port", "--formatter", "json").stdout or "[]")
    by_address = {(node.host, node.port): node.node for node in rabbit.nodes}
    return Counter(by_address.get((_address(row["host"]), int(row["port"])), "?") for row in rows)


def _address(value: str | list[int]) -> str:
    """Return an address the CLI's JSON printed as a string, an IPv4 tuple or a character list, as a string."""
    if isinstance(value, str):
        return value
    return ".".join(map(str, value)) if len(value) == 4 else "".join(map(chr, value))


def _leaders(rabbit: RabbitCluster, via: RabbitNode) -> Counter[str]:
    return Counter(leader for leader, _ in rabbit.queue_members(via).values())


def _node_back(node: RabbitNode, seconds: float, bring_back: Callable[[], None]) -> Callable[[], float]:
    """Return the `restore` of a broker fault: wait `seconds`, bring the node back, return when it runs."""

    def restore() -> float:
        time.sleep(seconds)
        bring_back()
        node.wait_started()
        return time.time()

    return restore


def _assert_the_cluster_rode_it_out(stack: Stack, fault: Fault) -> None:
    """The API never failed; /readyz said degraded (never down); every queue has its three members again."""
    assert not fault.api_errors, fault.report()
    assert "degraded" in fault.readyz, fault.readyz  # /readyz: broker up, one node of three away
    assert "down" not in fault.readyz, fault.readyz
    members = stack.rabbit.queue_members()
    assert all(len(m) == 3 for _, m in members.values()), members  # the node is a member of each again


# --- the faults -------------------------------------------------------------------------------------------------


@pytest.mark.timeout(420)
def test_quorum_queues_have_three_members_and_a_killed_leader_node_loses_and_doubles_nothing(stack: Stack) -> None:
    """SIGKILL the node every client sits on, leading the fan-out's and the OTPs' queues, mid fan-out.

    Restarted 10 s later. Node 1 is first in every process's failover list and leads every queue declared
    through it; it is made to lead `webhook.low` and `webhook.high` should another node lead them.
    """
    victim = stack.rabbit.nodes[0]
    members = stack.rabbit.queue_members()
    assert members and all(len(m) == 3 for _, m in members.values()), members  # replicated on every node
    for queue in ("webhook.low", "webhook.high"):
        if members[queue][0] != victim.node:
            stack.rabbit.transfer_leader(queue, victim)
    clients = _client_node(stack.rabbit, victim)
    print(f"\nleaders {_leaders(stack.rabbit, victim)}, client connections {clients}")
    print(f"killing {victim.node}: leads webhook.low and webhook.high, holds {clients[victim.node]} client connections")

    fault = run_fault(stack, "rabbitmq-node-killed", "broker", victim.kill, _node_back(victim, 10, victim.start))

    _assert_the_cluster_rode_it_out(stack, fault)
    # OTPs wait for webhook.high's new leader (elected 0.1-0.6 s after the peers see the connection close), the
    # publish's retry to it and their worker's reconnect.
    assert fault.otp_p99 < OTP_P99_BOUND, fault.report()


@pytest.mark.timeout(420)
def test_a_hung_broker_node_is_a_partition_the_cluster_rides_out(stack: Stack) -> None:
    """SIGSTOP a node no client sits on, leading webhook.high (to peers a partition); SIGCONT 25 s later."""
    via = stack.rabbit.nodes[0]
    clients = _client_node(stack.rabbit, via)
    leaders = _leaders(stack.rabbit, via)
    candidates = [n for n in stack.rabbit.nodes if clients[n.node] == 0] or stack.rabbit.nodes[1:]
    victim = max(candidates, key=lambda n: leaders[n.node])
    # The OTPs' queue led by the hung node: its publishes then wait for the peers to give the node up and elect.
    stack.rabbit.transfer_leader("webhook.high", victim)
    leaders = _leaders(stack.rabbit, via)
    print(f"\nleaders {leaders}, client connections {clients}; pausing {victim.node}, leading webhook.high")

    fault = run_fault(stack, "rabbitmq-node-partitioned", "broker", victim.pause, _node_back(victim, 25, victim.resume))

    _assert_the_cluster_rode_it_out(stack, fault)
    # OTPs wait for the peers' failure detector (polling every 250 ms, tests/cluster/servers.py) to give the node up
    # and elect; no send batch waits on the hung leader's count meanwhile (channels_app/gather.py).
    assert fault.otp_p99 < OTP_P99_BOUND, fault.report()


def _rabbit_running(node: RabbitNode) -> bool | None:
    """Return whether the node's rabbit application runs (False: paused or stopped; None: the VM did not answer)."""
    try:
        answer = node.ctl("eval", "rabbit:is_running().", timeout=15, check=False)
    except subprocess.TimeoutExpired:
        return None
    return {"true": True, "false": False}.get(answer.stdout.strip()) if answer.returncode == 0 else None


def _accepts_amqp(node: RabbitNode) -> bool:
    """Return whether the node's AMQP listener accepts a TCP connection (from the host: clients' side)."""
    try:
        socket.create_connection((node.host, node.port), timeout=2).close()
    except OSError:
        return False
    return True


def _consumer_nodes(via: RabbitNode, queue: str, nodes: list[RabbitNode]) -> Counter[str]:
    """Return on which node each consumer of `queue` has its channel (the node its client is connected to)."""
    # list_consumers prints a channel's pid without its node: ask the node for node(Pid) of each consumer.
    answer = via.ctl(
        "eval",
        '[node(proplists:get_value(channel_pid, C)) || C <- rabbit_amqqueue:consumers_all(<<"/">>),'
        f' element(4, proplists:get_value(queue_name, C)) =:= <<"{queue}">>].',
        timeout=30,
    ).stdout
    return Counter({n.node: answer.count(f"'{n.node}'") for n in nodes if f"'{n.node}'" in answer})


def _connected_to(worker: ServerProcess, node: RabbitNode) -> int:
    """Return how many times the Celery worker logged connecting its consumer to `node` (by its AMQP port)."""
    return len(re.findall(rf"Connected to amqp://[^\s\"]*:{node.port}//", worker.log()))


def _tasks_done(log: str) -> int:
    """Return how many tasks a worker's log excerpt shows both received and succeeded (not older ones finishing)."""
    received = set(re.findall(r"Task [\w.]+\[([0-9a-f-]+)\] received", log))
    return sum(1 for task_id in re.findall(r"Task [\w.]+\[([0-9a-f-]+)\] succeeded in", log) if task_id in received)


def _running_nodes(via: RabbitNode) -> list[str]:
    status = json.loads(via.ctl("cluster_status", "--formatter", "json", timeout=30).stdout)
    return sorted(status["running_nodes"])


# Its own stack's start counts too (70-125 s; three minutes on a box at load average 19).
@pytest.mark.timeout(420)
def test_a_network_partition_pauses_the_minority_node_and_its_clients_move_to_the_majority(
    partitionable_stack: tuple[Stack, NetLab],
) -> None:
    """Slow every broker node's link, then cut node 3 off its peers (clients reach both sides); heal; it rejoins.

    The API, the OTP worker and beat sit on the majority (node 1) and keep sending; the bulk worker sits on
    node 3. With pause_minority node 3, alone, stops its rabbit application: its AMQP listener refuses, its
    clients are closed, and the bulk worker continues on the majority. Once healed, node 3 runs again and is a
    running member. Exact accounting by dedup_key; OTP p99 under OTP_P99_BOUND throughout (a quorum remains).
    """
    stack, lab = partitionable_stack
    first, _, victim = stack.rabbit.nodes
    cut_off = victim.net
    brokers = [n.net for n in stack.rabbit.nodes if n.net]
    assert cut_off is not None
    # The OTP path must not depend on the cut node: its queue is led on the majority side (the bulk queues are led
    # wherever their first declaration put them, the cut node too).
    if stack.rabbit.queue_members(first)["webhook.high"][0] == victim.node:
        stack.rabbit.transfer_leader("webhook.high", first)
    assert _consumer_nodes(first, "webhook.low", stack.rabbit.nodes) == {victim.node: 1}  # the minority's client
    print(f"\nleaders {_leaders(stack.rabbit, first)}, client connections {_client_node(stack.rabbit, first)}")
    bulk = next(p for p in stack.processes if p.kind == "cluster-bulk")
    connected_before = _connected_to(bulk, first)
    seen: dict[str, Any] = {}

    def inject() -> None:
        lab.cut([cut_off], SLOW_RATE, among=brokers)

    def restore() -> float:
        _until(lambda: _rabbit_running(victim) is False, "the cut-off node pausing itself (pause_minority)", 45)
        seen["paused"] = time.time()
        seen["listener_refuses"] = not _accepts_amqp(victim)
        seen["majority_running"] = _running_nodes(first)
        # Its client, the bulk worker, reconnects down its failover list: to the majority (as it logs it).
        _until(
            lambda: _connected_to(bulk, first) > connected_before,
            "the minority's client connected to the majority",
            30,
        )
        seen["moved"] = time.time()
        log_at_move = len(bulk.log())
        seen["clients_during"] = _client_node(stack.rabbit, first)
        # ... and works there: a task received since and done (beat's maintenance tasks come once a second; the
        # worker no longer retries the paused node's URL before consuming, core/broker_consumer.py).
        _until(lambda: _tasks_done(bulk.log()[log_at_move:]), "the minority's client working on the majority", 45)
        seen["working"] = time.time()
        seen["dropped"] = {h.netns: lab.dropped_packets(h) for h in brokers}
        seen["slowed"] = {h.netns: lab.overlimits(h) for h in brokers}
        seen["still_paused"] = _rabbit_running(victim) is False
        lab.heal()
        seen["healed"] = time.time()
        _until(lambda: _rabbit_running(victim) is True, "the node running again after the heal", 60)
        _until(lambda: victim.node in _running_nodes(first), "the node back among the running members", 30)
        return time.time()

    fault = run_fault(stack, "rabbitmq-network-partition", "broker", inject, restore)

    print(
        f"cut: node paused {seen['paused'] - fault.t_fault:.1f}s after the cut, its client on the majority"
        f" {seen['moved'] - seen['paused']:.1f}s later; packets dropped by the cut {seen['dropped']}, held back by"
        f" the {SLOW_RATE} limit {seen['slowed']}; majority running {seen['majority_running']}, connections"
        f" {seen['clients_during']}, its client working there {seen['working'] - seen['moved']:.1f}s after it"
        f" connected; cut healed {seen['healed'] - fault.t_fault:.1f}s after it began, node back"
        f" {fault.t_back - seen['healed']:.1f}s after the heal"
    )
    assert seen["listener_refuses"], "the paused node's AMQP listener still accepts"
    assert seen["majority_running"] == sorted(n.node for n in stack.rabbit.nodes if n is not victim)
    assert seen["still_paused"], "the cut-off node ran again while still cut off"
    assert seen["clients_during"][victim.node] == 0, seen["clients_during"]
    assert all(seen["dropped"][h.netns] > 0 for h in brokers), seen["dropped"]  # the cut dropped, both sides
    assert sum(seen["slowed"].values()) > 0, seen["slowed"]  # the rate limit held packets back (where they flow)
    assert fault.otp_p99 < OTP_P99_BOUND, fault.report()
    _assert_the_cluster_rode_it_out(stack, fault)
    assert _running_nodes(first) == sorted(n.node for n in stack.rabbit.nodes)


def _inbox_stream(stack: Stack, user_id: str) -> SseReader:
    """Open the inbox stream of `user_id` (a new recipient) with a token minted over the API."""
    with httpx.Client(base_url=stack.api, headers={"Authorization": f"Bearer {stack.key}"}, timeout=10) as http:
        response = http.post(f"/api/v1/recipients/{user_id}/inbox-token", json={})
    assert response.status_code in (200, 201), response.text
    reader = SseReader(stack.stream_port, response.json()["token"])
    _until(lambda: reader.status == 200, "the inbox stream open", 15)
    return reader


def _alert_seen(stack: Stack, reader: SseReader, ref: str, within: float = 30) -> bool:
    """Send an in-app alert to the stream's user; return whether its message event arrived within `within` s."""
    body = {
        "recipient": {"user_id": "inbox-reader"}, "template": "alert", "channels": ["inapp"],
        "payload": {"ref": ref}, "dedup_key": f"inbox-alert-{ref}-{time.time_ns()}",
    }  # fmt: skip
    with httpx.Client(base_url=stack.api, headers={"Authorization": f"Bearer {stack.key}"}, timeout=10) as http:
        _until(lambda: http.post("/api/v1/notifications", json=body).status_code == 202, "the alert accepted", 30)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if any(item.get("title") == f"Alert {ref}" for item in reader.of("message")):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.timeout(420)
def test_postgresql_primary_lost_and_standby_promoted_loses_and_doubles_nothing(stack: Stack) -> None:
    """Crash the primary (immediate stop) mid fan-out; promote the standby 10 s later, as a managed failover does."""

    def restore() -> float:
        time.sleep(10)
        stack.pg.standby.promote()
        return time.time()

    reader = _inbox_stream(stack, "inbox-reader")
    assert _alert_seen(stack, reader, "before"), "the inbox stream delivered nothing before the fault"
    try:
        fault = run_fault(stack, "postgresql-failover", "database", lambda: stack.pg.primary.stop("immediate"), restore)
        # The stream server's LISTEN connection lost its server with the primary; it reconnects to the promoted one
        # (DATABASE_URL's read-write host) and the stream opened before the fault carries what is sent after it.
        seen_after = _alert_seen(stack, reader, "after")
    finally:
        reader.close()
    assert seen_after, "an in-app alert sent after the failover never reached the stream opened before it"
    assert reader.status == 200

    # While there is no primary the API answers 503 at once (never a 500, never silence past 10 s).
    assert set(fault.api_errors) <= {503}, fault.report()
    assert "down" in fault.readyz, fault.readyz
    # After the failover the old primary is gone: ready, but the database has one host of two.
    response = httpx.get(f"{stack.api}/readyz", timeout=10).json()
    assert response["checks"]["database"] == {**response["checks"]["database"], "ok": True, "nodes_up": 1}
    assert response["degraded"] == ["database"], response


@pytest.mark.timeout(420)
def test_redis_master_killed_and_replica_promoted_by_sentinel_loses_and_doubles_nothing(stack: Stack) -> None:
    """SIGKILL the Redis master mid fan-out; Sentinel promotes the replica; the old master returns as a replica."""
    master_port = stack.redis.master_port()
    assert master_port is not None
    old = stack.redis.node_on(master_port)

    def restore() -> float:
        _until(lambda: stack.redis.master_port() not in (None, master_port), "Sentinel promoting the replica", 60)
        back = time.time()
        time.sleep(5)
        old.start()  # comes back empty; the Sentinels make it a replica of the new master
        _until(lambda: stack.redis.known_replicas() >= 1, "the old master replicating again", 60)
        return back

    fault = run_fault(stack, "redis-failover", "redis", old.kill, restore)

    assert not fault.api_errors, fault.report()  # Redis is a fast path: the accept never waits on it
    assert fault.otp_p99 < OTP_P99_BOUND, fault.report()  # nor does the OTP's way to the provider
    assert {"down", "degraded"} & set(fault.readyz), fault.readyz
    response = httpx.get(f"{stack.api}/readyz", timeout=10).json()
    assert response["checks"]["redis"]["ok"] and not response["checks"]["redis"]["degraded"], response


def _sessions_on(server: PgServer, dbname: str) -> int:
    """Return how many client sessions of `dbname` on `server` have lasted 2 s or more (clients that stayed there)."""
    with psycopg.connect(server.conninfo("postgres"), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND datname = %s"
            " AND pid <> pg_backend_pid() AND backend_start < now() - interval '2 seconds'",
            [dbname],
        ).fetchone()
    return int(row[0]) if row else 0


# Its own stack's start counts too when it runs alone (the partition scenario shares it otherwise).
@pytest.mark.timeout(420)
def test_a_hung_postgresql_primary_is_noticed_within_seconds_and_comes_back_as_a_standby(
    partitionable_stack: tuple[Stack, NetLab],
) -> None:
    """Silence the primary's network mid fan-out; promote the standby 10 s later; fence, heal, re-clone the old one.

    Every packet the primary's namespace sends or receives is dropped: its processes run on with their sockets
    open, nothing answers (no RST). The service's libpq options (keepalives, tcp_user_timeout, connect_timeout)
    must end its connections within seconds: the API answers quick 503s meanwhile, then writes on the promoted
    standby. The old primary is stopped (the fence: it still thinks it is the primary), the cut healed, and it is
    made a standby of the new primary by a fresh base backup: in recovery, streaming, read-only, and the
    service's target_session_attrs keeps its clients off it. Exact accounting by dedup_key, every accepted
    delivery sent within DELIVERY_BOUND of the promotion.
    """
    stack, lab = partitionable_stack
    old, new = stack.pg.primary, stack.pg.standby
    assert old.net is not None and not old.in_recovery() and new.in_recovery()
    cut_off = old.net  # narrowed for the closures below
    seen: dict[str, Any] = {}

    def restore() -> float:
        time.sleep(HUNG_PROMOTE_AFTER)
        new.promote()
        promoted = time.time()
        load = stack.loads[-1]
        # The API writes again once its connections to the silent host are gone: a call made after the promotion
        # answered 202 (on the new primary: the old one is still silent).
        _until(
            lambda: any(c.status == 202 and c.started >= promoted for c in load.calls),
            "the API accepting on the promoted standby",
            HUNG_ACCEPTING_BOUND,
        )
        seen["accepting"] = min(c.ended for c in load.calls if c.status == 202 and c.started >= promoted)
        seen["dropped"] = (lab.dropped_packets(cut_off), lab.dropped_packets(cut_off, inbound=True))
        old.stop("immediate")  # the fence, while still cut off: it still takes itself for the primary
        lab.heal()
        stack.pg.rejoin_old_primary()
        seen["rejoined"] = time.time()
        return promoted

    stack.answer_within = HUNG_CLIENT_TIMEOUT  # a call's real duration, not the 10 s default cut-off
    try:
        fault = run_fault(stack, "postgresql-hung-primary", "database", lambda: lab.silence(cut_off), restore)
    finally:
        stack.answer_within = Stack.answer_within

    calls = [c for c in stack.loads[-1].calls if c.kind != "topic"]
    during = [c for c in calls if c.ended >= fault.t_fault and c.started <= seen["rejoined"]]
    errors = [c for c in during if c.status not in (200, 202)]
    first_error = min((c.ended for c in errors), default=math.nan) - fault.t_fault
    longest = max(c.ended - c.started for c in during)
    slow = [c for c in during if c.ended - c.started > 2]
    hits = [h.at for h in stack.receiver.snapshot()]
    first_hit_after = min((at for at in hits if at >= fault.t_back), default=math.nan)
    hits_silent = sum(1 for at in hits if fault.t_fault + 1 <= at < fault.t_back)
    print(
        f"hung primary: first API error {first_error:.1f}s after the silence, longest call {longest:.1f}s,"
        f" API accepting {seen['accepting'] - fault.t_back:.1f}s after the promotion, first delivery received"
        f" {first_hit_after - fault.t_back:.1f}s after it ({hits_silent} while it was silent); packets dropped"
        f" (sent, to it) {seen['dropped']};"
        f" old primary a streaming standby {seen['rejoined'] - fault.t_back:.1f}s after the promotion;"
        f" errors by status {Counter(c.status for c in errors)}; calls over 2 s (start from the silence, duration,"
        f" status): {[(round(c.started - fault.t_fault, 1), round(c.ended - c.started, 1), c.status) for c in slow]}"
    )
    assert seen["dropped"][0] > 0 and seen["dropped"][1] > 0, seen["dropped"]  # the silence silenced, both ways
    # Noticed: the API's only errors are 503s, every call answered (status 0: none within HUNG_CLIENT_TIMEOUT), none
    # later than the options allow.
    assert set(fault.api_errors) <= {503}, fault.report()
    assert longest <= HUNG_ANSWER_BOUND, f"a call took {longest:.1f}s"
    assert first_hit_after - fault.t_back <= HUNG_ACCEPTING_BOUND  # the workers send on the new primary
    # /readyz is not asserted during the silence: its own SELECT 1 hangs like any statement (up to tcp_user_timeout,
    # the probe's timeout too), so a probe may span the whole window; it is once the old primary is back, below.
    # After the rejoin nothing fails: clients are on the new primary only.
    assert not [c for c in calls if c.started >= seen["rejoined"] and c.status != 202]

    # The old primary is a standby of the new one: in recovery, streaming, fed by it, refusing writes.
    assert stack.pg.primary is new and stack.pg.standby is old
    assert old.in_recovery() and not new.in_recovery()
    assert old.host in stack.pg.streaming_from()
    marker = f"rejoined-{int(time.time())}"
    with psycopg.connect(new.conninfo("postgres"), autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS failover_probe (v text)")
        conn.execute("INSERT INTO failover_probe VALUES (%s)", [marker])

    def replayed() -> bool:
        with psycopg.connect(old.conninfo("postgres"), autocommit=True) as conn:
            return bool(conn.execute("SELECT 1 FROM failover_probe WHERE v = %s", [marker]).fetchone())

    _until(replayed, "a row written on the new primary replayed on the old one", 30)
    with (
        pytest.raises(psycopg.errors.ReadOnlySqlTransaction),
        psycopg.connect(old.conninfo("postgres"), autocommit=True) as conn,
    ):
        conn.execute("INSERT INTO failover_probe VALUES ('written on the standby')")
    assert _sessions_on(old, stack.pg.dbname) == 0  # target_session_attrs=read-write: no client stayed there
    response = httpx.get(f"{stack.api}/readyz", timeout=10).json()
    database = response["checks"]["database"]
    assert database["ok"] and database["nodes_up"] == 2 and not database["degraded"], response
    assert "database" not in response["degraded"], response


def _redis_role(node: RedisNode) -> tuple[str, int | None]:
    """Return the node's replication role and, for a replica, the port of its master (as the node itself says)."""
    info = node.client().info("replication")
    return str(info["role"]), (int(info["master_port"]) if info["role"] == "slave" else None)


# Its own stack's start counts too when it runs alone (the other namespace scenarios share it otherwise).
@pytest.mark.timeout(420)
def test_the_service_cut_from_the_redis_master_by_the_network_rides_out_the_sentinel_failover(
    partitionable_stack: tuple[Stack, NetLab],
) -> None:
    """Silence the Redis master's network mid fan-out; Sentinel promotes the replica; heal; it returns as a replica.

    Every packet the master's namespace sends or receives is dropped (a dead host: the service's connections to
    it stay open and get no answer, nothing is refused). The service's Redis clients (socket_timeout and
    socket_connect_timeout 0.5 s, core/redis_guard.py) give up on it within a second and fall back for the
    guard's retry period; through the Sentinels they find the promoted replica. Redis is a fast path: no API
    error, OTP p99 under OTP_P99_BOUND, exact accounting by dedup_key. Once healed, the Sentinels make the old
    master a replica of the new one.
    """
    stack, lab = partitionable_stack
    master_port = stack.redis.master_port()
    assert master_port is not None
    old = stack.redis.node_on(master_port)
    new = stack.redis.replica if old is stack.redis.master else stack.redis.master
    assert old.net is not None and _redis_role(old)[0] == "master"
    cut_off = old.net  # narrowed for the closures below
    seen: dict[str, Any] = {}

    def redis_ok() -> bool:
        check = httpx.get(f"{stack.api}/readyz", timeout=10).json()["checks"]["redis"]
        return bool(check["ok"])

    def restore() -> float:
        _until(lambda: stack.redis.master_port() == new.port, "Sentinel promoting the replica", 60)
        promoted = time.time()
        # The API's own client finds the new master through the Sentinels (its /readyz PING answers again).
        _until(redis_ok, "the API's Redis client on the promoted replica", REDIS_NOTICE_BOUND)
        seen["api_on_new"] = time.time()
        time.sleep(5)  # the old master stays cut off a little longer, then comes back
        seen["dropped"] = (lab.dropped_packets(cut_off), lab.dropped_packets(cut_off, inbound=True))
        lab.heal()
        seen["healed"] = time.time()
        _until(lambda: _redis_role(old) == ("slave", new.port), "the old master a replica of the new one", 60)
        _until(lambda: stack.redis.known_replicas() >= 1, "the Sentinels seeing the old master as a replica", 60)
        seen["replica"] = time.time()
        return promoted

    fault = run_fault(stack, "redis-cut-off", "redis", lambda: lab.silence(cut_off), restore)

    print(
        f"redis cut: replica promoted {fault.t_back - fault.t_fault:.1f}s after the silence, the API's client on it"
        f" {seen['api_on_new'] - fault.t_back:.1f}s after the promotion; packets dropped (sent, to it)"
        f" {seen['dropped']}; the old master a replica {seen['replica'] - seen['healed']:.1f}s after the heal"
    )
    assert seen["dropped"][0] > 0 and seen["dropped"][1] > 0, seen["dropped"]  # the silence silenced, both ways
    assert not fault.api_errors, fault.report()  # Redis is a fast path: the accept never waits on it
    assert fault.otp_p99 < OTP_P99_BOUND, fault.report()
    assert {"down", "degraded"} & set(fault.readyz), fault.readyz
    assert _redis_role(new) == ("master", None)
    response = httpx.get(f"{stack.api}/readyz", timeout=10).json()
    assert response["checks"]["redis"]["ok"] and not response["checks"]["redis"]["degraded"], response
