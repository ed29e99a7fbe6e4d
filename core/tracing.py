"""Tracing through the OpenTelemetry instrumentation packages, with Notifier's own spans where none exist.

Instrumented by the packages: incoming HTTP requests (Django), task publish and run with W3C trace context in
every message's headers (Celery), database statements (psycopg), Redis commands (redis), outgoing HTTP
(requests: FCM, Twilio, webhooks) and AWS calls (botocore: SES, SNS). Written here, because no instrumentation
exists for them: a span per provider call (`provider_span`) and a span per publish of delivery ids
(`span("publish <queue>")` in notifier/deliveries/outbox.py).

A trace starts at the API (or continues the caller's `traceparent`), travels in the headers of every Celery
message, and is continued by the worker that runs the task. Its trace id is bound into every log line on the
way. Spans are recorded and exported only when OTEL_EXPORTER_OTLP_ENDPOINT is set (or a test passes an
exporter), and then as the SDK's standard sampler switches say (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG;
parent-based always-on by default). Without an exporter the sampler drops every span at creation, the
per-statement and per-command wrappers (psycopg, Redis) are not even in the call path, the Django and Celery
instrumentations' handlers are skipped, Notifier's own spans are not made, and only the ids propagate.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import Token
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from core import metrics
from core.logs import bind_delivery_context, bound_log_context, clear_log_context

logger = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
_TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
# Probes and scrapes arrive every few seconds: no spans for them.
EXCLUDED_URLS = "healthz,readyz,metrics"
T = TypeVar("T")


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
        """Return a new span in the same trace."""
        return replace(self, span_id=new_span_id())

    def span_context(self) -> SpanContext:
        """Return this position as a remote OpenTelemetry span context."""
        return SpanContext(
            int(self.trace_id, 16), int(self.span_id, 16), is_remote=True, trace_flags=TraceFlags(int(self.flags, 16))
        )


def new_span_id() -> str:
    """Return a random 8-byte span id as 16 lower-case hex characters."""
    value = secrets.token_hex(8)
    return value if value != _ZERO_SPAN else new_span_id()


def new_trace(sampled: bool = True) -> TraceContext:
    """Start a new trace (a random 16-byte trace id)."""
    trace_id = secrets.token_hex(16)
    if trace_id == _ZERO_TRACE:
        return new_trace(sampled)
    return TraceContext(trace_id, new_span_id(), "01" if sampled else "00")


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


def _from_span_context(sc: SpanContext) -> TraceContext:
    return TraceContext(format(sc.trace_id, "032x"), format(sc.span_id, "016x"), f"{int(sc.trace_flags):02x}")


def current_trace() -> TraceContext | None:
    """Return the trace context of the running request, task or span, if any."""
    sc = trace.get_current_span().get_span_context()
    return _from_span_context(sc) if sc.is_valid else None


def current_trace_id() -> str:
    """Return the running trace id, or "" (the value Notification.trace_id stores)."""
    ctx = current_trace()
    return ctx.trace_id if ctx else ""


def activate(ctx: TraceContext) -> Token[Context]:
    """Make `ctx` the current trace position (as a remote parent) and bind its ids for logging.

    Returns the token for `deactivate`. For a position that came from outside (a header, a stored id).
    """
    bind_delivery_context(trace_id=ctx.trace_id, span_id=ctx.span_id)
    return otel_context.attach(trace.set_span_in_context(NonRecordingSpan(ctx.span_context())))


def deactivate(token: Token[Context]) -> None:
    """Restore the trace position that was current before `activate` returned `token`."""
    otel_context.detach(token)


# --- Provider, sampler, export -------------------------------------------------------------------------


class _SwitchableProcessor(SpanProcessor):
    """Forward finished spans to the configured processor, which `configure_tracing` may replace at any time."""

    def __init__(self) -> None:
        self.delegate: SpanProcessor | None = None

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        """Forward the span's start."""
        if self.delegate is not None:
            self.delegate.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        """Forward the finished span."""
        if self.delegate is not None:
            self.delegate.on_end(span)

    def shutdown(self) -> None:
        """Shut the delegate down (flushing what it holds)."""
        if self.delegate is not None:
            self.delegate.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the delegate."""
        return self.delegate.force_flush(timeout_millis) if self.delegate is not None else True


def sampler_from_environment() -> Sampler:
    """Return the sampler the SDK's standard switches ask for (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG).

    The SDK's own reading: `parentbased_always_on` when unset, an unknown name or a bad ratio logged and replaced
    by the default (a typo never turns tracing off or fails the start).
    """
    from opentelemetry.sdk.trace import sampling

    return sampling._get_from_env_or_default()


class _ExportSampler(Sampler):
    """Sample by the configured sampler only while an exporter is configured; drop everything otherwise.

    Without an exporter every span is dropped at creation: no attributes, no processor calls, but valid ids, so
    the trace id still propagates to logs, messages and responses.
    """

    def __init__(self) -> None:
        self.exporting = False
        self.delegate: Sampler = sampler_from_environment()

    def should_sample(
        self,
        parent_context: otel_context.Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Any = None,
        links: Sequence[Any] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        """Sample as the configured sampler says while exporting; drop otherwise."""
        if self.exporting:
            return self.delegate.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)
        return SamplingResult(Decision.DROP)

    def get_description(self) -> str:
        """Describe the sampler."""
        return f"NotifierExportSampler{{{self.delegate.get_description()}}}"


_lock = threading.Lock()
_processor = _SwitchableProcessor()
_sampler = _ExportSampler()
_state: dict[str, Any] = {"provider": None, "tracer": None, "instrumented": False, "redis": False, "celery": None}
# A bulk INSERT's statement runs to megabytes: attribute values are cut here unless the standard
# OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT / OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT say otherwise.
_DEFAULT_ATTRIBUTE_LENGTH = 2048


def _provider() -> TracerProvider:
    with _lock:
        provider: TracerProvider | None = _state["provider"]
        if provider is None:
            from django.conf import settings

            limits = SpanLimits()
            if limits.max_span_attribute_length is None:
                limits = SpanLimits(max_span_attribute_length=_DEFAULT_ATTRIBUTE_LENGTH)
            provider = TracerProvider(
                resource=Resource.create({"service.name": settings.OTEL_SERVICE_NAME}),
                sampler=_sampler,
                span_limits=limits,
            )
            provider.add_span_processor(_processor)
            trace.set_tracer_provider(provider)
            _state["provider"] = provider
        return provider


def tracer() -> trace.Tracer:
    """Return Notifier's tracer (made once: the provider builds a new one on every ask)."""
    found: trace.Tracer | None = _state["tracer"]
    if found is None:
        found = _state["tracer"] = _provider().get_tracer("notifier")
    return found


def configure_tracing(*, endpoint: str | None = None, exporter: Any = None, service_name: str | None = None) -> bool:
    """Export spans over OTLP/HTTP to `endpoint` (default: the settings) or to `exporter`; return whether on.

    Tests pass an in-memory exporter (exported synchronously). `service_name` is fixed at the first call. The
    sampler is read again from OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG on every call.
    """
    from django.conf import settings
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    del service_name  # the resource is created once, from OTEL_SERVICE_NAME
    _provider()
    endpoint = settings.OTEL_EXPORTER_OTLP_ENDPOINT if endpoint is None else endpoint
    processor: SpanProcessor | None = None
    if exporter is not None:
        processor = SimpleSpanProcessor(exporter)
    elif endpoint:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            logger.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter is not installed")
        else:
            processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces"))
    sampler = sampler_from_environment()
    with _lock:
        old, _processor.delegate = _processor.delegate, processor
        _sampler.delegate = sampler
        _sampler.exporting = processor is not None
    if old is not None:
        old.shutdown()
    if _state["instrumented"]:
        _instrument_redis(processor is not None)
        _switch_database_cursors(processor is not None)
    return processor is not None


def _instrument_redis(on: bool) -> None:
    """Wrap Redis commands in spans only while spans are exported.

    The wrapper cost about 0.1 ms of CPU per command even when the sampler dropped its span, and an accept or
    a send batch runs several commands; the other instrumentations run once per request or provider call.
    """
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    with _lock:
        if _state["redis"] == on:
            return
        _state["redis"] = on
    if on:
        RedisInstrumentor().instrument(tracer_provider=_provider())
    else:
        RedisInstrumentor().uninstrument()


def reset_tracing() -> None:
    """Stop exporting spans (tests)."""
    configure_tracing(endpoint="")


def instrument() -> None:
    """Turn on the instrumentation packages and the database spans (idempotent; from NotifierConfig.ready).

    Before any request is served: the Django instrumentation adds its middleware to settings.MIDDLEWARE.
    """
    with _lock:
        if _state["instrumented"]:
            return
        _state["instrumented"] = True
    provider = _provider()
    from opentelemetry.instrumentation.botocore import BotocoreInstrumentor
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    DjangoInstrumentor().instrument(tracer_provider=provider, excluded_urls=EXCLUDED_URLS)
    _django_middleware_while_exporting()
    CeleryWhileExporting(CeleryInstrumentor()).instrument(provider)
    RequestsInstrumentor().instrument(tracer_provider=provider)
    BotocoreInstrumentor().instrument(tracer_provider=provider)
    PsycopgInstrumentor().instrument(tracer_provider=provider)
    _keep_async_connections_plain()
    _instrument_database()
    _connect_task_context()
    configure_tracing()  # Redis and the database cursors follow the exporter (_instrument_redis, _switch_...)


_OTEL_DJANGO_MIDDLEWARE = "opentelemetry.instrumentation.django.middleware.otel_middleware._DjangoMiddleware"


def _django_middleware_while_exporting() -> None:
    """Put WhileExportingMiddleware where the Django instrumentation inserted its middleware."""
    from django.conf import settings

    settings.MIDDLEWARE = [
        "core.tracing.WhileExportingMiddleware" if path == _OTEL_DJANGO_MIDDLEWARE else path
        for path in settings.MIDDLEWARE
    ]


class WhileExportingMiddleware:
    """The OpenTelemetry Django middleware, run only while spans are exported.

    Without an exporter the sampler drops its server span at creation, and RequestContextMiddleware gives the
    request its trace position anyway (the caller's `traceparent` continued, or a new trace), so the ids still
    travel into logs, tasks and the response. What the middleware did per request then (reading the request's
    attributes, extracting the context, counting active requests) bought nothing: 6 % of an API process's CPU
    under single sends.
    """

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        from opentelemetry.instrumentation.django.middleware.otel_middleware import _DjangoMiddleware

        self.get_response = get_response
        self._traced = _DjangoMiddleware(get_response)

    def __call__(self, request: Any) -> Any:
        if _sampler.exporting:
            return self._traced(request)
        return self.get_response(request)


# --- Notifier's own spans ----------------------------------------------------------------------------


@contextmanager
def span(name: str, *, kind: str = "internal", **attributes: Any) -> Iterator[TraceContext]:
    """Run a block as a child span of the current trace (a new trace if there is none); bind it for logs.

    With no exporter no span is made (one per publish: a dropped span still cost its creation, about 15 µs): the
    block runs in the current trace, or in a new one, and its logs carry that trace's ids.
    """
    if not _sampler.exporting:
        ctx = current_trace()
        token = None
        if ctx is None:
            ctx = new_trace()
            token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(ctx.span_context())))
        try:
            with bind_delivery_context(trace_id=ctx.trace_id, span_id=ctx.span_id):
                yield ctx
        finally:
            if token is not None:
                otel_context.detach(token)
        return
    span_kind = getattr(SpanKind, kind.upper(), SpanKind.INTERNAL)
    with tracer().start_as_current_span(name, kind=span_kind, attributes=attributes) as otel_span:
        ctx = _from_span_context(otel_span.get_span_context())
        with bind_delivery_context(trace_id=ctx.trace_id, span_id=ctx.span_id):
            yield ctx


def exporting() -> bool:
    """Return whether spans are recorded and exported (an exporter is configured)."""
    return _sampler.exporting


@contextmanager
def provider_span(provider: str, channel: str, messages: int, operation: str = "send") -> Iterator[TraceContext | None]:
    """A client span for one call to a provider (`operation` send or send_batch); errors are recorded on it.

    With no exporter this is nothing at all (one per provider call: a dropped span still cost its creation and
    context switch); the call's logs carry the task's trace id as before.
    """
    if not _sampler.exporting:
        yield current_trace()
        return
    with span(
        f"provider.{operation} {provider}",
        kind="client",
        **{"notifier.provider": provider, "notifier.channel": channel, "notifier.messages": messages},
    ) as ctx:
        yield ctx


def current_span_context() -> SpanContext | None:
    """Return the current span's context to carry to another thread (None outside any trace)."""
    sc = trace.get_current_span().get_span_context()
    return sc if sc.is_valid else None


@contextmanager
def continue_from(contexts: Sequence[SpanContext]) -> Iterator[None]:
    """Run a block on behalf of the requests whose span contexts are given (a background publisher).

    One request: the block continues its trace, as if it ran in the request. Several (their ids travel in one
    message): a `coalesced` span starts a trace of its own, linked to each request's span (up to 128).
    """
    if len(contexts) == 1:
        token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(contexts[0])))
        try:
            yield
        finally:
            otel_context.detach(token)
        return
    if not _sampler.exporting:
        yield  # nothing would record the links: the block's spans start a trace of their own
        return
    links = [trace.Link(sc) for sc in contexts[:128]]
    with tracer().start_as_current_span("coalesced publish", kind=SpanKind.INTERNAL, links=links):
        yield


def mark_error(error: BaseException) -> None:
    """Record `error` on the current span and mark it failed (for errors returned, not raised)."""
    from opentelemetry.trace import Status, StatusCode

    current = trace.get_current_span()
    if current.is_recording():
        current.record_exception(error)
        current.set_status(Status(StatusCode.ERROR, type(error).__name__))


def carry_context(fn: Callable[..., T]) -> Callable[..., T]:
    """Wrap `fn` to run in the caller's trace context when a pool thread calls it (threads start empty)."""
    parent = otel_context.get_current()

    def run(*args: Any, **kwargs: Any) -> T:
        token = otel_context.attach(parent)
        try:
            return fn(*args, **kwargs)
        finally:
            otel_context.detach(token)

    return run


# psycopg connections opened by Django (weakly: a closed connection drops out), each with its two cursor
# classes: Django's own and the psycopg instrumentation's traced subclass of it.
_db_connections: weakref.WeakKeyDictionary[Any, tuple[type, type]] = weakref.WeakKeyDictionary()


def _database_cursor(connection: Any, **_kwargs: Any) -> None:
    """Remember a new connection's cursor classes and pick the one that matches the exporter.

    The instrumentation wraps psycopg's connect, so a connection arrives with the traced cursor class. That class
    parses every statement and starts a span even when the sampler drops it: while nothing exports, the
    connection gets Django's own cursor class back, and no statement passes through the instrumentation.
    """
    raw = getattr(connection, "connection", None)
    traced = getattr(raw, "cursor_factory", None)
    if raw is None or traced is None:
        return
    plain = connection.get_connection_params().get("cursor_factory") or traced
    if plain is traced or not issubclass(traced, plain):
        return  # opened before the instrumentation (nothing to switch)
    with _lock:
        _db_connections[raw] = (plain, traced)
        raw.cursor_factory = traced if _sampler.exporting else plain


def _switch_database_cursors(on: bool) -> None:
    """Give every open connection the traced cursor class (`on`) or Django's own (a cursor is made per query)."""
    with _lock:
        for raw, (plain, traced) in list(_db_connections.items()):
            raw.cursor_factory = traced if on else plain


def _keep_async_connections_plain() -> None:
    """Leave psycopg's AsyncConnection.connect unwrapped: only Django's connections are traced.

    The async connections are the inbox stream server's own (notifier/inbox/stream.py), which polls many
    times a second; their cursors cannot be switched with the exporter as Django's are, and a traced cursor
    costs a span per statement even while nothing exports.
    """
    import psycopg
    from opentelemetry.instrumentation.dbapi import unwrap_connect

    unwrap_connect(psycopg.AsyncConnection, "connect")


def _instrument_database() -> None:
    from django.db.backends.signals import connection_created

    connection_created.connect(_database_cursor, weak=False, dispatch_uid="core.tracing.db")


class CeleryWhileExporting:
    """The OpenTelemetry Celery instrumentation, run only while spans are exported; the trace travels without it.

    Without an exporter its spans are dropped at creation, but making them (a consumer span around every task
    run, a producer span around every publish, each with its context switches and a histogram) was 2.5 % of a
    send worker's CPU under single sends. Then only the ids travel, as through a process without the SDK: a
    publish puts a child of the current trace position in the message's `traceparent` header, and a task runs
    in a child of the position its message carries (of its caller's when run eagerly, else a new trace).
    A task or publish that began while spans were exported ends through the instrumentation, which holds it.
    """

    def __init__(self, instrumentor: Any) -> None:
        self._otel = instrumentor
        # The context tokens of the tasks running in the trace their message carried, by task id.
        self._tokens: dict[str, Token[Context]] = {}
        # (signal, the instrumentation's handler, the gate in its place)
        self.gates: list[tuple[Any, Callable[..., None], Callable[..., None]]] = []

    def instrument(self, provider: TracerProvider) -> None:
        """Instrument Celery, then put these gates in place of the instrumentation's run and publish handlers."""
        from celery import signals

        self._otel.instrument(tracer_provider=provider)
        otel = self._otel
        self.gates = [
            (signals.task_prerun, otel._trace_prerun, self.prerun),
            (signals.task_postrun, otel._trace_postrun, self.postrun),
            (signals.before_task_publish, otel._trace_before_publish, self.before_publish),
            (signals.after_task_publish, otel._trace_after_publish, self.after_publish),
        ]
        for signal, handler, gate in self.gates:
            signal.disconnect(handler)
            signal.connect(gate, weak=False)
        _state["celery"] = self

    def prerun(self, *args: Any, **kwargs: Any) -> None:
        """Start the task's span while exporting; otherwise attach the trace position its message carries."""
        if _sampler.exporting:
            self._otel._trace_prerun(*args, **kwargs)
            return
        task_id = kwargs.get("task_id")
        if task_id is None:
            return
        # A message's header; an eager run (task.apply) has none and goes on in its caller's trace.
        parent = parse_traceparent(getattr(getattr(kwargs.get("task"), "request", None), TRACEPARENT, None))
        parent = parent or current_trace()
        position = parent.child() if parent is not None else new_trace()
        span = NonRecordingSpan(position.span_context())
        self._tokens[task_id] = otel_context.attach(trace.set_span_in_context(span))

    def postrun(self, *args: Any, **kwargs: Any) -> None:
        """End the task's span if the instrumentation holds one; otherwise detach what `prerun` attached."""
        from opentelemetry.instrumentation.celery import utils

        task_id = kwargs.get("task_id")
        if task_id is None:
            return
        if utils.retrieve_context(kwargs.get("task"), task_id) is not None:
            self._otel._trace_postrun(*args, **kwargs)
            return
        token = self._tokens.pop(task_id, None)
        if token is not None:
            otel_context.detach(token)

    def before_publish(self, *args: Any, **kwargs: Any) -> None:
        """Start the publish's span while exporting; otherwise put the current trace position in the headers."""
        if _sampler.exporting:
            self._otel._trace_before_publish(*args, **kwargs)
            return
        headers = kwargs.get("headers")
        position = current_trace()
        if headers is not None and position is not None:
            headers[TRACEPARENT] = position.child().traceparent

    def after_publish(self, *args: Any, **kwargs: Any) -> None:
        """End the publish's span if the instrumentation holds one."""
        from opentelemetry.instrumentation.celery import utils

        task = utils.retrieve_task_from_sender(kwargs)
        task_id = utils.retrieve_task_id_from_message(kwargs)
        if task_id is not None and utils.retrieve_context(task, task_id, is_publish=True) is not None:
            self._otel._trace_after_publish(*args, **kwargs)


# --- Celery: logs and task metrics -------------------------------------------------------------------

_running: dict[str, tuple[float, Any]] = {}
_running_lock = threading.Lock()


def on_task_prerun(task_id: str | None = None, task: Any = None, **_kwargs: Any) -> None:
    """Bind the task's trace (its span, started by the Celery instrumentation) and ids to the task's logs."""
    request = getattr(task, "request", None)
    # An eager run (task.apply) happens inside its caller's request or task: keep the caller's log context to
    # restore afterwards. In a worker, threads and prefork children run task after task: start empty.
    saved = bound_log_context() if getattr(request, "is_eager", False) else None
    clear_log_context()
    ctx = current_trace()
    if ctx is not None:
        bind_delivery_context(trace_id=ctx.trace_id, span_id=ctx.span_id)
    bind_delivery_context(task_id=task_id, task=getattr(task, "name", "task"))
    with _running_lock:
        _running[task_id or ""] = (time.monotonic(), saved)


def on_task_postrun(task_id: str | None = None, task: Any = None, state: str | None = None, **_kwargs: Any) -> None:
    """Count the task, and clear its log context (restoring an eager caller's)."""
    with _running_lock:
        started, saved = _running.pop(task_id or "", (None, None))
    elapsed = time.monotonic() - started if started is not None else None
    metrics.observe_task(getattr(task, "name", "unknown"), state or "unknown", elapsed)
    clear_log_context()
    if saved:
        bind_delivery_context(**saved)


def _connect_task_context() -> None:
    # Connected after the Celery instrumentation's own handlers, so its span is current when ours run.
    from celery.signals import task_postrun, task_prerun

    task_prerun.connect(on_task_prerun, weak=False, dispatch_uid="core.tracing.prerun")
    task_postrun.connect(on_task_postrun, weak=False, dispatch_uid="core.tracing.postrun")


def connect_signals() -> None:
    """Connect the worker metrics (called by config/celery.py; the trace handlers connect in `instrument`)."""
    metrics.connect_worker_metrics()
