"""Prometheus metrics: every metric object of the service, the helpers that update them, and the scrape.

Multiprocess-safe: when PROMETHEUS_MULTIPROC_DIR is set in the environment (it must be, before this module
is imported, in any container that runs several processes: gunicorn workers, prefork Celery children), each
process writes its samples to files in that directory and a scrape aggregates them. Gauges therefore
declare how to combine processes; none uses a "live" mode, so no clean-up hook is needed when a child exits.
Queue depths, dead-letter depths and pending dead letters are not counted by anyone: they are read at
scrape time (passive queue declares on RabbitMQ, one COUNT in PostgreSQL).

Label values are bounded sets only (channel, provider, status, category, client name, queue): never an id
or an address.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from amqp.channel import Channel as AmqpChannel

logger = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
BREAKER_STATES = {"closed": 0, "half_open": 1, "half-open": 1, "open": 2}
_PROVIDER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
_TASK_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

# --- Accept ------------------------------------------------------------------------------------------
NOTIFICATIONS_ACCEPTED = Counter(
    "notifier_notifications_accepted",
    "Notifications accepted by the API (duplicates excluded).",
    ["category", "client"],
)
# --- Deliveries and providers ------------------------------------------------------------------------
DELIVERIES = Counter(
    "notifier_deliveries",
    "Delivery outcomes by channel, provider and resulting status (sent, failed, retried, suppressed, ...).",
    ["channel", "provider", "status"],
)
PROVIDER_CALL_SECONDS = Histogram(
    "notifier_provider_call_seconds",
    "Duration of provider calls by outcome (ok, retriable, permanent, throttled, timeout).",
    ["provider", "outcome"],
    buckets=_PROVIDER_BUCKETS,
)
THROTTLED = Counter(
    "notifier_provider_throttled",
    "Sends held back by the shared rate limiter or refused by a provider with 429.",
    ["provider"],
)
RATE_LIMIT_TOKENS = Counter(
    "notifier_ratelimit_tokens",
    "Shared rate-limit tokens asked for, by provider, priority and result (granted, denied).",
    ["provider", "priority", "result"],
)
DELIVERY_LATENCY_SECONDS = Histogram(
    "notifier_delivery_latency_seconds",
    "Time from accept to the provider's acknowledgement of sent deliveries, by channel and priority "
    "(priority high, channel sms is the OTP latency).",
    ["channel", "priority"],
    buckets=_LATENCY_BUCKETS,
)
BREAKER_STATE = Gauge(
    "notifier_breaker_state",
    "Circuit breaker state per provider: 0 closed, 1 half-open, 2 open (last value set by any process).",
    ["provider"],
    multiprocess_mode="mostrecent",
)
BREAKER_TRANSITIONS = Counter(
    "notifier_breaker_transitions",
    "Circuit breaker state changes per provider and new state.",
    ["provider", "state"],
)
SMS_SEGMENTS = Counter(
    "notifier_sms_segments", "SMS segments sent (what providers bill), by encoding (gsm7, ucs2).", ["encoding"]
)
# --- Fan-out -----------------------------------------------------------------------------------------
FANOUT_DELIVERIES = Counter(
    "notifier_fanout_deliveries_created", "Deliveries written by topic and campaign fan-out.", ["channel"]
)
FANOUT_PAGES = Counter("notifier_fanout_pages", "Subscriber pages processed by fan-out.")
FANOUTS_COMPLETED = Counter("notifier_fanouts_completed", "Fan-outs that reached the end of their topic.")
# --- Outbox, retention -------------------------------------------------------------------------------
OUTBOX_REPUBLISHED = Counter(
    "notifier_outbox_republished", "Deliveries re-published by the outbox relay (the fast path missed them)."
)
RETENTION_DELETED = Counter("notifier_retention_deleted", "Rows deleted by the retention purge.", ["table"])
# --- HTTP and Celery tasks ---------------------------------------------------------------------------
HTTP_REQUESTS = Counter(
    "notifier_http_requests", "API requests by method, route and status code.", ["method", "route", "status"]
)
HTTP_REQUEST_SECONDS = Histogram(
    "notifier_http_request_seconds", "API request duration by method and route.", ["method", "route"],
    buckets=_HTTP_BUCKETS,
)  # fmt: skip
TASKS = Counter("notifier_celery_tasks", "Celery tasks finished, by task name and state.", ["task", "state"])
TASK_SECONDS = Histogram(
    "notifier_celery_task_seconds", "Celery task run time by task name.", ["task"], buckets=_TASK_BUCKETS
)


def _label(value: object, default: str = "unknown") -> str:
    text = str(value) if value not in (None, "") else default
    return text[:64]


def count_accepted(category: str, client: str) -> None:
    """Count one accepted notification of `category` from API client `client` (its name)."""
    NOTIFICATIONS_ACCEPTED.labels(_label(category), _label(client)).inc()


def count_deliveries(channel: str, provider: str, status: str, n: int = 1) -> None:
    """Count `n` deliveries of `channel` through `provider` that reached `status`."""
    if n > 0:
        DELIVERIES.labels(_label(channel), _label(provider, "none"), _label(status)).inc(n)


def count_sms_segments(encoding: str, n: int) -> None:
    """Count `n` SMS segments sent in `encoding`."""
    if n > 0:
        SMS_SEGMENTS.labels(_label(encoding)).inc(n)


def observe_provider_call(provider: str, seconds: float, outcome: str) -> None:
    """Record one provider call's duration and outcome (ok, retriable, permanent, throttled, timeout)."""
    PROVIDER_CALL_SECONDS.labels(_label(provider), _label(outcome)).observe(max(seconds, 0.0))


def count_throttled(provider: str, n: int = 1) -> None:
    """Count sends held back by the rate limiter (or refused by the provider as too many)."""
    if n > 0:
        THROTTLED.labels(_label(provider)).inc(n)


def count_rate_limit(provider: str, priority: str, requested: int, granted: int) -> None:
    """Count one shared rate-limit request: `granted` of `requested` tokens, the rest denied (deferred)."""
    if granted > 0:
        RATE_LIMIT_TOKENS.labels(_label(provider), _label(priority), "granted").inc(granted)
    if requested > granted:
        RATE_LIMIT_TOKENS.labels(_label(provider), _label(priority), "denied").inc(requested - granted)


def observe_delivery_latency(channel: str, priority: str, seconds: Iterable[float]) -> None:
    """Record accept-to-sent times of sent deliveries of one channel and priority."""
    histogram = DELIVERY_LATENCY_SECONDS.labels(_label(channel), _label(priority))
    for value in seconds:
        histogram.observe(max(value, 0.0))


def set_breaker_state(provider: str, state: str) -> None:
    """Publish a breaker's state ("closed", "half_open" or "open"); call it on every transition."""
    key = state.lower()
    BREAKER_STATE.labels(_label(provider)).set(BREAKER_STATES.get(key, -1))
    BREAKER_TRANSITIONS.labels(_label(provider), _label(key)).inc()


def fanout_progress(*, created: int, channel: str = "all", pages: int = 1, done: bool = False) -> None:
    """Record one fan-out step: deliveries created, pages processed, and whether the fan-out finished."""
    if created > 0:
        FANOUT_DELIVERIES.labels(_label(channel)).inc(created)
    if pages > 0:
        FANOUT_PAGES.inc(pages)
    if done:
        FANOUTS_COMPLETED.inc()


def count_republished(n: int) -> None:
    """Count deliveries the outbox relay had to publish again."""
    if n > 0:
        OUTBOX_REPUBLISHED.inc(n)


def count_retention_deleted(table: str, n: int) -> None:
    """Count rows removed by the retention purge."""
    if n > 0:
        RETENTION_DELETED.labels(_label(table)).inc(n)


def observe_http(method: str, route: str, status: int, seconds: float) -> None:
    """Record one API request (route is the URL pattern's name, never the raw path)."""
    HTTP_REQUESTS.labels(_label(method), _label(route), str(status)).inc()
    HTTP_REQUEST_SECONDS.labels(_label(method), _label(route)).observe(max(seconds, 0.0))


def observe_task(task: str, state: str, seconds: float | None) -> None:
    """Record one finished Celery task."""
    TASKS.labels(_label(task, "unknown")[:128], _label(state)).inc()
    if seconds is not None:
        TASK_SECONDS.labels(_label(task, "unknown")[:128]).observe(max(seconds, 0.0))


# --- Read at scrape time -----------------------------------------------------------------------------


def collect_queue_depths(timeout: float | None = None) -> dict[str, tuple[int, int]] | None:
    """Return {queue: (ready messages, consumers)} for every queue of the topology; None if unreachable.

    Passive declares only: a scrape never creates a queue, and a queue missing on the broker is left out.
    """
    from django.conf import settings
    from kombu import Connection

    from config.celery import build_queues

    timeout = settings.METRICS_BROKER_TIMEOUT_SECONDS if timeout is None else timeout
    depths: dict[str, tuple[int, int]] = {}
    try:
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=timeout) as conn:
            conn.ensure_connection(max_retries=0)
            # The broker is RabbitMQ (py-amqp transport): its channels have queue_declare, kombu's StdChannel not.
            channel = cast("AmqpChannel", conn.channel())
            for queue in build_queues():
                try:
                    # A declare answers a (name, messages, consumers) tuple; None only with nowait=True.
                    declared = channel.queue_declare(queue=queue.name, passive=True)
                    _, messages, consumers = cast("tuple[str, int, int]", declared)
                except conn.channel_errors:
                    # A missing queue closes the channel (404): note nothing, carry on with a fresh one.
                    channel = cast("AmqpChannel", conn.channel())
                    continue
                depths[queue.name] = (int(messages), int(consumers))
    except Exception as exc:
        logger.warning("queue depth collection failed", extra={"error": type(exc).__name__})
        return None
    return depths


def collect_outbox_state() -> tuple[int, float] | None:
    """Return (relay backlog, age in seconds of the oldest delivery waiting in a queue); None if unreachable.

    The backlog is what the relay has to publish: queued deliveries never published (the fast path missed
    them) or published longer ago than OUTBOX_STALE_AFTER_SECONDS. Both read the partial index on queued
    deliveries (delivery_outbox_idx); the count stops at 100,000.
    """
    from django.conf import settings
    from django.db import connection

    sql = """
        SELECT
          (SELECT count(*) FROM (
             SELECT 1 FROM notifier_delivery
             WHERE status = 'queued'
               AND (published_at IS NULL OR published_at < now() - make_interval(secs => %s))
             LIMIT 100000) AS backlog),
          (SELECT coalesce(extract(epoch FROM now() - min(published_at)), 0)
             FROM notifier_delivery WHERE status = 'queued' AND published_at IS NOT NULL)
    """
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, [settings.OUTBOX_STALE_AFTER_SECONDS])
            backlog, oldest = cursor.fetchone()
        return int(backlog), max(float(oldest), 0.0)
    except Exception as exc:
        logger.warning("outbox state read failed", extra={"error": type(exc).__name__})
        return None


def collect_pending_dead_letters() -> dict[str, int] | None:
    """Return pending dead letters per channel; None if the database is unreachable."""
    from django.db.models import Count

    from notifier.models import DeadLetter

    try:
        rows = (
            DeadLetter.objects.filter(status=DeadLetter.Status.PENDING)
            .values("channel")
            .annotate(n=Count("id"))
            .order_by()
        )
        return {row["channel"]: int(row["n"]) for row in rows}
    except Exception as exc:
        logger.warning("dead letter count failed", extra={"error": type(exc).__name__})
        return None


class OpsCollector(Collector):
    """Read broker and database state at scrape time (only in the API's /metrics, never per worker)."""

    def collect(self) -> Iterator[Metric]:
        """Yield queue depths, consumers, dead-letter depths, broker reachability and pending dead letters."""
        from django.conf import settings

        if settings.METRICS_QUEUE_DEPTHS:
            depths = collect_queue_depths()
            up = GaugeMetricFamily("notifier_broker_up", "1 if RabbitMQ answered the scrape's queue declares.")
            up.add_metric([], 0 if depths is None else 1)
            yield up
            depth = GaugeMetricFamily("notifier_queue_depth", "Ready messages per work queue.", labels=["queue"])
            consumers = GaugeMetricFamily("notifier_queue_consumers", "Consumers per work queue.", labels=["queue"])
            dead = GaugeMetricFamily(
                "notifier_dead_letter_queue_depth", "Messages in each dead-letter queue.", labels=["queue"]
            )
            for name, (messages, n_consumers) in sorted((depths or {}).items()):
                if name.startswith("dead."):
                    dead.add_metric([name], messages)
                else:
                    depth.add_metric([name], messages)
                    consumers.add_metric([name], n_consumers)
            yield depth
            yield consumers
            yield dead
        outbox = collect_outbox_state()
        if outbox is not None:
            backlog = GaugeMetricFamily(
                "notifier_outbox_backlog", "Queued deliveries the outbox relay has to publish (missed or stale)."
            )
            backlog.add_metric([], outbox[0])
            yield backlog
            oldest = GaugeMetricFamily(
                "notifier_queued_oldest_seconds",
                "Age of the oldest delivery published to a queue and not yet taken by a worker.",
            )
            oldest.add_metric([], outbox[1])
            yield oldest
        pending = collect_pending_dead_letters()
        if pending is not None:
            family = GaugeMetricFamily(
                "notifier_dead_letters_pending", "Dead letters awaiting an operator, per channel.", labels=["channel"]
            )
            for channel, n in sorted(pending.items()):
                family.add_metric([channel], n)
            yield family


class _Proxy(Collector):
    """Expose another registry's metrics through a scrape registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        """Yield everything the wrapped registry holds."""
        return self._registry.collect()


def multiprocess_dir() -> str:
    """Return the multiprocess directory in use, or "" in single-process mode."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
    return path if path and os.path.isdir(path) else ""


def process_registry() -> CollectorRegistry:
    """Return a registry with every process's samples (multiprocess) or this process's (single)."""
    registry = CollectorRegistry()
    if multiprocess_dir():
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_Proxy(REGISTRY))
    return registry


def render_metrics(*, include_ops: bool = True) -> bytes:
    """Return the Prometheus text exposition for a scrape."""
    registry = process_registry()
    if include_ops:
        registry.register(OpsCollector())
    return generate_latest(registry)


_server_lock = threading.Lock()
_server_started = False


def start_worker_metrics_server(port: int | None = None, addr: str = "0.0.0.0") -> bool:  # noqa: S104
    """Serve this worker's metrics (all its children's, in multiprocess mode) on `port`; once per process."""
    from django.conf import settings

    global _server_started
    port = settings.METRICS_WORKER_PORT if port is None else port
    if not port or not settings.METRICS_ENABLED:
        return False
    with _server_lock:
        if _server_started:
            return False
        from prometheus_client import start_http_server

        start_http_server(port, addr=addr, registry=process_registry())
        _server_started = True
    logger.info("worker metrics server listening", extra={"port": port})
    return True


def _on_worker_ready(**_kwargs: Any) -> None:
    try:
        start_worker_metrics_server()
    except OSError as exc:
        # A port clash must not stop the worker from sending notifications.
        logger.warning("worker metrics server not started", extra={"error": str(exc)})


def _on_breaker_change(provider: str, _old: str, new: str) -> None:
    set_breaker_state(provider, new)


def connect_breaker_metrics() -> bool:
    """Publish every circuit-breaker transition made in this process as `notifier_breaker_state`."""
    try:
        from channels_app import breaker
    except ImportError:
        return False
    if _on_breaker_change not in breaker._listeners:
        breaker.on_state_change(_on_breaker_change)
    return True


def _on_worker_init(**_kwargs: Any) -> None:
    # In the main worker process, before prefork children are forked: they inherit the listener.
    connect_breaker_metrics()


def connect_worker_metrics() -> None:
    """Hook worker metrics into Celery (connected by tracing.connect_signals).

    At worker start the breaker listener is registered; when the worker is ready its metrics server starts.
    """
    from celery.signals import worker_init, worker_ready

    worker_init.connect(_on_worker_init, weak=False, dispatch_uid="notifier.metrics.worker_init")
    worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid="notifier.metrics.worker_ready")
