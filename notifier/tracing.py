"""W3C trace context across the API, the broker and the workers; OpenTelemetry spans when configured.

A trace starts at the API (or continues the caller's `traceparent`), travels in the `traceparent` header of
every Celery message this process publishes, and is picked up by the worker that runs the task. Its trace
id is bound into every log line on the way, so one `trace_id` finds the request, the fan-out and every send.
Spans are exported only when OTEL_EXPORTER_OTLP_ENDPOINT is set; otherwise all of this is plain string
handling with no OpenTelemetry SDK in the path.
"""

from __future__ import annotations

import contextvars
import logging
import re
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from notifier import metrics
from notifier.logging import bind_delivery_context, bound_log_context, clear_log_context

logger = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
_TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


@dataclass(frozen=True)
class TraceContext:
    """A position in a trace: the trace id, the current span id and the trace flags."""

    trace_id: str
    span_id: str
    flags: str = "01"

    @property
    def traceparent(self) -> str:
        """Return the W3C `traceparent` header value for this context (version 00)."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    @property
    def sampled(self) -> bool:
        """Return whether the caller asked for this trace to be recorded."""
        return bool(int(self.flags, 16) & 1)

    def child(self) -> TraceContext:
        """Return a new span in the same trace (what a hop to a new process or operation gets)."""
        return replace(self, span_id=new_span_id())


def new_trace_id() -> str:
    """Return a random 16-byte trace id as 32 lower-case hex characters."""
    value = secrets.token_hex(16)
    return value if value != _ZERO_TRACE else new_trace_id()


def new_span_id() -> str:
    """Return a random 8-byte span id as 16 lower-case hex characters."""
    value = secrets.token_hex(8)
    return value if value != _ZERO_SPAN else new_span_id()


def new_trace(sampled: bool = True) -> TraceContext:
    """Start a new trace."""
    return TraceContext(new_trace_id(), new_span_id(), "01" if sampled else "00")


def parse_traceparent(value: str | bytes | None) -> TraceContext | None:
    """Parse a W3C `traceparent` header; None if it is missing or invalid (the caller then starts a new trace).

    Per the spec: version ff is invalid, all-zero ids are invalid, version 00 has exactly four fields, and
    a higher version may carry more fields after the fourth, which are ignored.
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    match = _TRACEPARENT_RE.match(value.strip())
    if not match:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return TraceContext(trace_id, span_id, flags)


_current: contextvars.ContextVar[TraceContext | None] = contextvars.ContextVar("notifier_trace", default=None)


def current_trace() -> TraceContext | None:
    """Return the trace context of the running request or task, if any."""
    return _current.get()


def current_trace_id() -> str:
    """Return the running trace id, or "" (the value Notification.trace_id stores)."""
    ctx = _current.get()
    return ctx.trace_id if ctx else ""


def activate(ctx: TraceContext) -> contextvars.Token[TraceContext | None]:
    """Make `ctx` the current trace context and bind its ids for logging."""
    bind_delivery_context(trace_id=ctx.trace_id, span_id=ctx.span_id)
    return _current.set(ctx)


def deactivate(token: contextvars.Token[TraceContext | None] | None = None) -> None:
    """Forget the current trace context (restoring the previous one when given its token)."""
    if token is not None:
        _current.reset(token)
    else:
        _current.set(None)


# --- OpenTelemetry (optional) ------------------------------------------------------------------------

_otel_lock = threading.Lock()
_otel_state: dict[str, Any] = {"configured": False, "tracer": None, "provider": None}


def configure_tracing(*, endpoint: str | None = None, exporter: Any = None, service_name: str | None = None) -> bool:
    """Set up span export (OTLP over HTTP to `endpoint`, or the given exporter); returns whether it is on.

    Called lazily on first use with the settings; tests pass an in-memory exporter. Without an endpoint or
    exporter tracing stays a no-op.
    """
    from django.conf import settings

    endpoint = settings.OTEL_EXPORTER_OTLP_ENDPOINT if endpoint is None else endpoint
    service_name = service_name or settings.OTEL_SERVICE_NAME
    with _otel_lock:
        _otel_state["configured"] = True
        if not endpoint and exporter is None:
            _otel_state["tracer"] = None
            return False
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        if exporter is None:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                logger.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter is not installed")
                _otel_state["tracer"] = None
                return False
            exporter = OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces")
            processor: Any = BatchSpanProcessor(exporter)
        else:
            processor = SimpleSpanProcessor(exporter)
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        provider.add_span_processor(processor)
        if _otel_state["provider"] is not None:
            _otel_state["provider"].shutdown()
        _otel_state["provider"] = provider
        _otel_state["tracer"] = provider.get_tracer("notifier")
        return True


def reset_tracing() -> None:
    """Turn span export off and forget the configuration (tests)."""
    with _otel_lock:
        if _otel_state["provider"] is not None:
            _otel_state["provider"].shutdown()
        _otel_state.update(configured=False, tracer=None, provider=None)


def _tracer() -> Any:
    if not _otel_state["configured"]:
        configure_tracing()
    return _otel_state["tracer"]


def start_span(name: str, parent: TraceContext, *, kind: str = "internal", attributes: Mapping[str, Any] | None = None):
    """Start an OpenTelemetry span under `parent`; return (span or None, the context to continue with).

    With export off the span is None and the context is simply `parent.child()`.
    """
    tracer = _tracer()
    if tracer is None:
        return None, parent.child()
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    otel_parent = TraceContextTextMapPropagator().extract({TRACEPARENT: parent.traceparent})
    span = tracer.start_span(
        name,
        context=otel_parent,
        kind=getattr(SpanKind, kind.upper(), SpanKind.INTERNAL),
        attributes=dict(attributes or {}),
    )
    sc = span.get_span_context()
    return span, TraceContext(format(sc.trace_id, "032x"), format(sc.span_id, "016x"), f"{int(sc.trace_flags):02x}")


def end_span(span: Any, *, error: BaseException | None = None, attributes: Mapping[str, Any] | None = None) -> None:
    """End a span from `start_span` (None is accepted and ignored)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    for key, value in (attributes or {}).items():
        span.set_attribute(key, value)
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
    span.end()


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[TraceContext]:
    """Run a block as a child span of the current trace (a new trace if there is none)."""
    parent = current_trace() or new_trace()
    otel_span, ctx = start_span(name, parent, attributes=attributes)
    token = _current.set(ctx)
    error: BaseException | None = None
    try:
        with bind_delivery_context(trace_id=ctx.trace_id, span_id=ctx.span_id):
            yield ctx
    except BaseException as exc:
        error = exc
        raise
    finally:
        end_span(otel_span, error=error)
        _current.reset(token)


# --- Celery ------------------------------------------------------------------------------------------

_running: dict[str, tuple[float, Any, Any]] = {}
_running_lock = threading.Lock()


def on_before_task_publish(headers: dict[str, Any] | None = None, **_kwargs: Any) -> None:
    """Put the current trace (a new one if there is none, as for beat) into the message's headers."""
    if headers is None or headers.get(TRACEPARENT):
        return
    parent = current_trace()
    headers[TRACEPARENT] = (parent.child() if parent else new_trace()).traceparent


def _message_traceparent(task: Any) -> str | None:
    request = getattr(task, "request", None)
    if request is None:
        return None
    value = getattr(request, TRACEPARENT, None)
    if not value:
        # Eager runs (task.apply) keep the headers under request.headers.
        headers = getattr(request, "headers", None) or {}
        value = headers.get(TRACEPARENT) if isinstance(headers, Mapping) else None
    return value


def on_task_prerun(task_id: str | None = None, task: Any = None, **_kwargs: Any) -> None:
    """Continue the message's trace in the worker and bind it (with the task id) to the task's logs."""
    request = getattr(task, "request", None)
    # An eager run (task.apply) happens inside its caller's request or task: keep the caller's context to
    # restore afterwards. In a worker, prefork children and threads run task after task, and nothing of the
    # previous one may leak, so the context starts empty.
    saved = (bound_log_context(), current_trace()) if getattr(request, "is_eager", False) else None
    clear_log_context()
    parent = parse_traceparent(_message_traceparent(task)) or new_trace()
    name = getattr(task, "name", "task")
    otel_span, ctx = start_span(name, parent, kind="consumer", attributes={"celery.task_id": task_id or ""})
    activate(ctx)
    bind_delivery_context(task_id=task_id, task=name)
    with _running_lock:
        _running[task_id or ""] = (time.monotonic(), otel_span, saved)


def on_task_postrun(task_id: str | None = None, task: Any = None, state: str | None = None, **_kwargs: Any) -> None:
    """End the task's span, count it, and clear its log context (restoring an eager caller's)."""
    with _running_lock:
        started, otel_span, saved = _running.pop(task_id or "", (None, None, None))
    elapsed = time.monotonic() - started if started is not None else None
    end_span(otel_span, attributes={"celery.state": state or ""})
    metrics.observe_task(getattr(task, "name", "unknown"), state or "unknown", elapsed)
    deactivate()
    clear_log_context()
    if saved is not None:
        context, trace = saved
        if context:
            bind_delivery_context(**context)
        if trace is not None:
            _current.set(trace)


def connect_signals() -> None:
    """Connect the trace-propagation and worker-metrics handlers to Celery's signals (idempotent).

    Call once from config/celery.py after the app is created; it applies to every process that imports
    the app (the API publishing, the workers consuming, beat).
    """
    from celery.signals import before_task_publish, task_postrun, task_prerun

    before_task_publish.connect(on_before_task_publish, weak=False, dispatch_uid="notifier.tracing.publish")
    task_prerun.connect(on_task_prerun, weak=False, dispatch_uid="notifier.tracing.prerun")
    task_postrun.connect(on_task_postrun, weak=False, dispatch_uid="notifier.tracing.postrun")
    metrics.connect_worker_metrics()
