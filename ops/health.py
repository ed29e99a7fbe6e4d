"""Operations endpoints: liveness, readiness with per-dependency detail, and the Prometheus scrape.

None of them takes an API key: they are meant for the orchestrator and the monitoring system, and they
reveal no data (dependency names, up/down, latency and an error class, never a URL or a credential).
"""

from __future__ import annotations

import functools
import hmac
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from core import metrics
from core.database_url import configured_hosts
from core.redis_guard import get_redis, get_sentinel
from ops.collectors import OpsCollector

logger = logging.getLogger(__name__)


# A check returns nothing, or the counts of a replicated dependency ({"nodes": n, "nodes_up": k}); it raises when
# the dependency cannot serve. One node of several down is "degraded": still ready, but worth an alert.
Detail = dict[str, Any] | None


def check_database() -> Detail:
    """Run a trivial query on the default database; with a multi-host DATABASE_URL, also count the hosts up."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    db = settings.DATABASES["default"]
    hosts = configured_hosts(db)
    if len(hosts) < 2:
        return None
    return _count_up([functools.partial(_probe_database_host, db, host, port) for host, port in hosts])


def _probe_database_host(db: dict[str, Any], host: str, port: int) -> None:
    """Connect to one host of the database (primary or standby alike) and run SELECT 1."""
    import psycopg

    timeout = max(1, round(settings.READYZ_TIMEOUT_SECONDS))
    options = db.get("OPTIONS", {})
    params = {"user": db.get("USER") or None, "password": db.get("PASSWORD") or None, "sslmode": options.get("sslmode")}
    with psycopg.connect(host=host, port=port, dbname=db["NAME"], connect_timeout=timeout, **params) as conn:
        conn.execute("SELECT 1")


def check_broker() -> Detail:
    """Open (and close) an AMQP connection to each URL of CELERY_BROKER_URL (`;` separates a cluster's nodes)."""
    urls = [url for url in settings.CELERY_BROKER_URL.split(";") if url.strip()]
    if len(urls) < 2:
        _probe_broker(settings.CELERY_BROKER_URL)
        return None
    return _count_up([functools.partial(_probe_broker, url.strip()) for url in urls])


def _probe_broker(url: str) -> None:
    """Open (and close) one AMQP connection with a short timeout and no retries."""
    from kombu import Connection

    timeout = settings.READYZ_TIMEOUT_SECONDS
    with Connection(url, connect_timeout=timeout, heartbeat=0) as conn:
        # No retries: a readiness probe answers now; the orchestrator asks again.
        conn.ensure_connection(max_retries=0)


def check_redis() -> Detail:
    """Ping Redis (the shared client has sub-second timeouts); behind Sentinel, also count the replicas up."""
    if not get_redis().ping():
        raise ConnectionError("no PONG")
    sentinel = get_sentinel()
    if sentinel is None:
        return None
    for node in sentinel.sentinels:
        try:
            replicas = node.sentinel_slaves(settings.REDIS_SENTINEL_MASTER)
        except (redis.RedisError, OSError):
            continue
        healthy = [r for r in replicas if not (r["is_sdown"] or r["is_odown"] or r["is_disconnected"])]
        return {"nodes": 1 + len(replicas), "nodes_up": 1 + len(healthy)}
    # The master answers but no Sentinel does: whatever replicas there are, nothing would promote one if the
    # master died, so count the master alone of at least two.
    return {"nodes": 2, "nodes_up": 1}


def _count_up(probes: list[Callable[[], None]]) -> dict[str, Any]:
    """Run the probes of one dependency's nodes at once; raise the first error if none is up, else count them."""
    with ThreadPoolExecutor(max_workers=len(probes)) as pool:
        futures = [pool.submit(probe) for probe in probes]
    errors = [future.exception() for future in futures]
    up = sum(1 for error in errors if error is None)
    if not up:
        raise next(error for error in errors if error is not None)
    return {"nodes": len(probes), "nodes_up": up}


CHECKS: dict[str, Callable[[], Detail]] = {
    "database": check_database,
    "broker": check_broker,
    "redis": check_redis,
}


def run_checks() -> dict[str, dict[str, Any]]:
    """Run every dependency check; return {name: {"ok", "latency_ms", "error"?, "nodes"?, "nodes_up"?, "degraded"?}}."""
    results: dict[str, dict[str, Any]] = {}
    for name, check in CHECKS.items():
        started = time.monotonic()
        try:
            detail = check()
        except Exception as exc:
            results[name] = {
                "ok": False,
                "latency_ms": round((time.monotonic() - started) * 1000, 1),
                "error": type(exc).__name__,
            }
            logger.warning("readiness check failed", extra={"dependency": name, "error": type(exc).__name__})
        else:
            results[name] = {"ok": True, "latency_ms": round((time.monotonic() - started) * 1000, 1)}
            if detail:
                results[name].update(detail, degraded=detail["nodes_up"] < detail["nodes"])
    return results


class DependencyCollector(Collector):
    """The readiness checks as metrics at scrape time: up, and nodes up of nodes, per dependency."""

    def collect(self) -> Iterator[Metric]:
        """Run the checks once; yield notifier_dependency_up, _nodes and _nodes_up (a lone node counts 1 of 1)."""
        checks = run_checks()
        labels = ["dependency"]
        up = GaugeMetricFamily(
            "notifier_dependency_up", "1 if the dependency served the readiness check.", labels=labels
        )
        nodes = GaugeMetricFamily("notifier_dependency_nodes", "Nodes configured for the dependency.", labels=labels)
        nodes_up = GaugeMetricFamily(
            "notifier_dependency_nodes_up", "Nodes of the dependency that answered.", labels=labels
        )
        for name, result in checks.items():
            up.add_metric([name], 1.0 if result["ok"] else 0.0)
            nodes.add_metric([name], float(result.get("nodes", 1)))
            nodes_up.add_metric([name], float(result.get("nodes_up", 1 if result["ok"] else 0)))
        yield from (up, nodes, nodes_up)


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """Answer 200 while the process can serve requests (no dependency is touched)."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """Answer 200 when database, broker and Redis are reachable, else 503; the per-dependency detail for operators."""
    checks = run_checks()
    ready = all(result["ok"] for result in checks.values())
    body: dict[str, Any] = {"status": "ok" if ready else "unavailable"}
    if operator_allowed(request):
        body["checks"] = checks
        # Ready, but a replicated dependency lost a node: the next fault would be an outage.
        body["degraded"] = sorted(name for name, result in checks.items() if result.get("degraded"))
    return JsonResponse(body, status=200 if ready else 503)


def operator_allowed(request: HttpRequest) -> bool:
    """Return whether the request may see operator detail: no METRICS_TOKEN set, or its Bearer matches."""
    token = settings.METRICS_TOKEN
    if not token:
        return True
    scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return scheme == "Bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve every process's metrics plus queue and dead-letter depths in Prometheus text format."""
    if not settings.METRICS_ENABLED:
        return HttpResponse("metrics disabled\n", status=404, content_type="text/plain")
    if not operator_allowed(request):
        response = HttpResponse("Bearer METRICS_TOKEN required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = "Bearer"
        return response
    return HttpResponse(
        metrics.render_metrics(collectors=[OpsCollector(), DependencyCollector()]), content_type=metrics.CONTENT_TYPE
    )
