"""Request middleware: trace context in and out, per-request log context, access log and HTTP metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from notifier import metrics, tracing
from notifier.logging import bind_delivery_context, clear_log_context

access_log = logging.getLogger("notifier.access")

# Probes and scrapes arrive every few seconds: counting them is useful, logging each one is noise.
QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class RequestContextMiddleware:
    """Continue the caller's W3C trace (or start one), bind it to the request's logs, echo it on the response.

    The response's `traceparent` carries the same trace id with this request's span id, so a caller can
    find every log line, task and send of its request by that trace id.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # Gunicorn threads serve request after request: nothing bound for the previous one may leak.
        clear_log_context()
        parent = tracing.parse_traceparent(request.headers.get(tracing.TRACEPARENT)) or tracing.new_trace()
        otel_span, ctx = tracing.start_span(
            f"HTTP {request.method}", parent, kind="server", attributes={"http.request.method": request.method or ""}
        )
        token = tracing.activate(ctx)
        # notifier.apis reads request.trace_id to store it on the notification.
        request.trace_context = ctx  # type: ignore[attr-defined]
        request.trace_id = ctx.trace_id  # type: ignore[attr-defined]
        started = time.monotonic()
        status = 500
        error: BaseException | None = None
        try:
            response = self.get_response(request)
            status = response.status_code
            response[tracing.TRACEPARENT] = ctx.traceparent
            return response
        except BaseException as exc:
            error = exc
            raise
        finally:
            elapsed = time.monotonic() - started
            route = _route(request)
            tracing.end_span(
                otel_span, error=error, attributes={"http.route": route, "http.response.status_code": status}
            )
            if settings.METRICS_ENABLED:
                metrics.observe_http(request.method or "", route, status, elapsed)
            if settings.LOG_REQUESTS and request.path not in QUIET_PATHS:
                bind_delivery_context(http_method=request.method, http_route=route)
                # Never the raw path or query string: both may carry user ids, emails or tokens.
                access_log.info("request", extra={"status": status, "duration_ms": round(elapsed * 1000, 1)})
            tracing.deactivate(token)
            clear_log_context()


def _route(request: HttpRequest) -> str:
    match = getattr(request, "resolver_match", None)
    if match is None:
        return "unmatched"
    return match.route or match.view_name or "unmatched"
