"""Request middleware: trace id in the logs and on the response, access log and HTTP metrics."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from core import config_cache, metrics, tracing
from core.logs import bind_delivery_context, clear_log_context
from projects.scoping import request_scope_begin, request_scope_end

access_log = logging.getLogger("notifier.access")

# Probes and scrapes arrive every few seconds: counting them is useful, logging each one is noise.
QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class SuccessLines:
    """Let through at most one access line per interval for requests that succeeded; count the ones held back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0.0
        self._held = 0

    def take(self, now: float, interval: float) -> int | None:
        """Return how many were held back since the last line let through, or None to hold this one back too."""
        with self._lock:
            if now < self._next:
                self._held += 1
                return None
            self._next = now + interval
            held, self._held = self._held, 0
            return held


_success_lines = SuccessLines()


class RequestContextMiddleware:
    """Bind the request's trace to its logs and echo it on the response; access log and HTTP metrics.

    The server span comes from the OpenTelemetry Django instrumentation (its middleware runs first and
    continues the caller's `traceparent`). Paths it leaves out (probes, scrapes) get a trace position here,
    from the caller's header or new, so every log line still carries a trace id. The response's `traceparent`
    carries the trace id with this request's span id, so a caller can find every log line, task and send of
    its request by that trace id.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # Gunicorn threads serve request after request: nothing bound for the previous one may leak.
        clear_log_context()
        ctx = tracing.current_trace()
        token = None
        if ctx is None:
            parent = tracing.parse_traceparent(request.headers.get(tracing.TRACEPARENT))
            ctx = parent.child() if parent else tracing.new_trace()
            token = tracing.activate(ctx)
        bind_delivery_context(trace_id=ctx.trace_id, span_id=ctx.span_id)
        # notifier.accepting.apis reads request.trace_id to store it on the notification.
        request.trace_context = ctx  # type: ignore[attr-defined]  # our own request attributes, read by views
        request.trace_id = ctx.trace_id  # type: ignore[attr-defined]  # (notifier.accepting.apis: trace_id_of)
        started = time.monotonic()
        status = 500
        # A request starts with no owner; its authentication enters its key's (projects.scoping).
        owner_token = request_scope_begin()
        try:
            with config_cache.one_generation():  # the request's cached lookups share one Redis read
                response = self.get_response(request)
            status = response.status_code
            response[tracing.TRACEPARENT] = ctx.traceparent
            return response
        finally:
            request_scope_end(owner_token)
            elapsed = time.monotonic() - started
            route = _route(request)
            if settings.METRICS_ENABLED:
                metrics.observe_http(request.method or "", route, status, elapsed)
            line = _access_line(request, status, elapsed)
            if line is not None:
                bind_delivery_context(http_method=request.method, http_route=route)
                # Never the raw path or query string: both may carry user ids, emails or tokens.
                access_log.info("request", extra=line)
            if token is not None:
                tracing.deactivate(token)
            clear_log_context()


def _access_line(request: HttpRequest, status: int, elapsed: float) -> dict[str, Any] | None:
    """Return the access line's fields, or None where the request gets none (see REQUEST_SUCCESS_LOG_SECONDS)."""
    if not settings.LOG_REQUESTS or request.path in QUIET_PATHS:
        return None
    line: dict[str, Any] = {"status": status, "duration_ms": round(elapsed * 1000, 1)}
    interval = settings.REQUEST_SUCCESS_LOG_SECONDS
    if status >= 400 or interval <= 0:
        return line
    held = _success_lines.take(time.monotonic(), interval)
    if held is None:
        return None
    return {**line, "successes_not_logged": held} if held else line


def _route(request: HttpRequest) -> str:
    match = getattr(request, "resolver_match", None)
    if match is None:
        return "unmatched"
    return match.route or match.view_name or "unmatched"
