"""Prometheus metrics: every metric object of the service, the helpers that update them, and the scrape.

Multiprocess-safe: when PROMETHEUS_MULTIPROC_DIR is set in the environment (it must be, before this module
is imported, in any container that runs several processes: gunicorn workers, prefork Celery children), each
process writes its samples to files in that directory and a scrape aggregates them. Gauges therefore
declare how to combine processes; none uses a "live" mode, so no clean-up hook is needed when a child exits.
Queue depths, dead-letter depths and pending dead letters are not counted by anyone: they are read at
scrape time by ops/collectors.py (passive queue declares on RabbitMQ, one COUNT in PostgreSQL), which the
/metrics view hands to `render_metrics`.

Label values are bounded sets only (channel, provider, status, category, client name, queue): never an id
or an address.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from typing import Any

from celery.signals import worker_ready
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from core.env import env

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
    "Notifications accepted by the API (duplicates excluded), by category, client and mode (live or test key).",
    ["category", "client", "mode"],
)
# --- Deliveries and providers ------------------------------------------------------------------------
DELIVERIES = Counter(
    "notifier_deliveries",
    "Delivery outcomes by channel, provider, resulting status (sent, failed, retried, suppressed, ...) and mode"
    " (live, or test: a test key's, all through the sandbox provider).",
    ["channel", "provider", "status", "mode"],
)
PROVIDER_CALL_SECONDS = Histogram(
    "notifier_provider_call_seconds",
    "Duration of provider calls by outcome (ok, retriable, permanent, throttled, timeout).",
    ["provider", "outcome"],
    buckets=_PROVIDER_BUCKETS,
)
SEND_GATHERED = Counter(
    "notifier_send_gathered_messages",
    "Send messages a worker took from their queue into the batch it was about to send (singles sent together).",
    ["queue"],
)
SEND_GATHER_PAUSED = Counter(
    "notifier_send_gather_paused",
    "Times a worker process stopped gathering from a queue for a while: the broker took too long to count it.",
    ["queue"],
)
SEND_COMBINED = Counter(
    "notifier_send_combined_messages",
    "Send messages of a worker process sent in the batch of another of its threads (singles sent together).",
    ["queue"],
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


def count_accepted(category: str, client: str, mode: str = "live", n: int = 1) -> None:
    """Count `n` accepted notifications of `category` from API client `client` (its name) in `mode`."""
    if n > 0:
        NOTIFICATIONS_ACCEPTED.labels(_label(category), _label(client), _label(mode, "live")).inc(n)


def count_deliveries(channel: str, provider: str, status: str, n: int = 1, mode: str = "live") -> None:
    """Count `n` deliveries of `channel` through `provider` that reached `status`, in `mode` (live or test)."""
    if n > 0:
        DELIVERIES.labels(_label(channel), _label(provider, "none"), _label(status), _label(mode, "live")).inc(n)


def count_sms_segments(encoding: str, n: int) -> None:
    """Count `n` SMS segments sent in `encoding`."""
    if n > 0:
        SMS_SEGMENTS.labels(_label(encoding)).inc(n)


def observe_provider_call(provider: str, seconds: float, outcome: str) -> None:
    """Record one provider call's duration and outcome (ok, retriable, permanent, throttled, timeout)."""
    PROVIDER_CALL_SECONDS.labels(_label(provider), _label(outcome)).observe(max(seconds, 0.0))


def count_gathered(queue: str, n: int) -> None:
    """Count send messages taken from `queue` into a running batch."""
    SEND_GATHERED.labels(_label(queue)).inc(n)


def count_gather_paused(queue: str) -> None:
    """Count a pause of gathering from `queue` (its ready messages were counted too slowly)."""
    SEND_GATHER_PAUSED.labels(_label(queue)).inc()


def count_combined(queue: str, n: int) -> None:
    """Count send messages of `queue` that joined another thread's batch in the same worker process."""
    if n > 0:
        SEND_COMBINED.labels(_label(queue)).inc(n)


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


class _Proxy(Collector):
    """Expose another registry's metrics through a scrape registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        """Yield everything the wrapped registry holds."""
        return self._registry.collect()


def multiprocess_dir() -> str:
    """Return the multiprocess directory in use, or "" in single-process mode."""
    # The environment's, not Django's setting: prometheus_client reads the variable itself at import.
    path = env.str("PROMETHEUS_MULTIPROC_DIR")
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


def render_metrics(*, collectors: Iterable[Collector] = ()) -> bytes:
    """Return the Prometheus text exposition for a scrape, with `collectors` read at scrape time added."""
    registry = process_registry()
    for collector in collectors:
        registry.register(collector)
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


def connect_worker_metrics() -> None:
    """Hook worker metrics into Celery (connected by tracing.connect_signals): when the worker is ready its
    metrics server starts. (Breaker-state gauges: channels_app.breaker registers its own listener.)
    """
    worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid="core.metrics.worker_ready")
