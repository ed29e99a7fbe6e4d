"""Operations endpoints: liveness, readiness with per-dependency detail, and the Prometheus scrape.

None of them takes an API key: they are meant for the orchestrator and the monitoring system, and they
reveal no data (dependency names, up/down, latency and an error class, never a URL or a credential).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from core import metrics
from core.redis_guard import get_redis
from ops.collectors import OpsCollector

logger = logging.getLogger(__name__)


def check_database() -> None:
    """Run a trivial query on the default database."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def check_broker() -> None:
    """Open (and close) an AMQP connection to settings.CELERY_BROKER_URL with a short timeout."""
    from kombu import Connection

    timeout = settings.READYZ_TIMEOUT_SECONDS
    with Connection(settings.CELERY_BROKER_URL, connect_timeout=timeout, heartbeat=0) as conn:
        # No retries: a readiness probe answers now; the orchestrator asks again.
        conn.ensure_connection(max_retries=0)


def check_redis() -> None:
    """Ping Redis (the shared client has sub-second timeouts)."""
    if not get_redis().ping():
        raise ConnectionError("no PONG")


CHECKS: dict[str, Callable[[], None]] = {
    "database": check_database,
    "broker": check_broker,
    "redis": check_redis,
}


def run_checks() -> dict[str, dict[str, Any]]:
    """Run every dependency check; return {name: {"ok", "latency_ms", "error"?}}."""
    results: dict[str, dict[str, Any]] = {}
    for name, check in CHECKS.items():
        started = time.monotonic()
        try:
            check()
        except Exception as exc:
            results[name] = {
                "ok": False,
                "latency_ms": round((time.monotonic() - started) * 1000, 1),
                "error": type(exc).__name__,
            }
            logger.warning("readiness check failed", extra={"dependency": name, "error": type(exc).__name__})
        else:
            results[name] = {"ok": True, "latency_ms": round((time.monotonic() - started) * 1000, 1)}
    return results


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
    return HttpResponse(metrics.render_metrics(collectors=[OpsCollector()]), content_type=metrics.CONTENT_TYPE)
