"""Tracing: W3C trace context parsing, the OpenTelemetry instrumentation (Django, Celery) with trace ids in
the logs, and Notifier's own spans for provider calls and publishes reaching an exporter end to end."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.urls import path

from config.celery import app as celery_app
from core import tracing
from core.logs import bound_log_context, clear_log_context, get_logger, json_formatter
from tests.conftest import purge_all_queues

INCOMING = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def _echo_context(request: HttpRequest) -> JsonResponse:
    get_logger("notifier.test").info("inside the view")
    # trace_id is our own request attribute, set by notifier.clients.middleware.
    return JsonResponse({"context": bound_log_context(), "trace_id": request.trace_id})  # type: ignore[attr-defined]


urlpatterns = [path("ops-test/echo", _echo_context)]


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    """Capture root log output as JSON lines."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield stream
    root.removeHandler(handler)
    root.setLevel(old_level)
    clear_log_context()


def _lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


@pytest.mark.pure
@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff is invalid
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case is invalid
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # version 00 has four fields
    ],
)
def test_invalid_traceparent_is_rejected(value: str | None) -> None:
    """Anything that is not a valid W3C traceparent parses to None (a new trace is started instead)."""
    assert tracing.parse_traceparent(value) is None


@pytest.mark.pure
def test_traceparent_round_trip_and_future_versions() -> None:
    """A valid header parses to its parts; a later version with extra fields is accepted."""
    ctx = tracing.parse_traceparent(INCOMING)
    assert ctx is not None and ctx.trace_id == TRACE_ID and ctx.span_id == "00f067aa0ba902b7" and ctx.sampled
    assert ctx.traceparent == INCOMING
    assert tracing.parse_traceparent("cc-" + INCOMING[3:] + "-what-the-future-brings") is not None
    fresh = tracing.new_trace()
    assert tracing.parse_traceparent(fresh.traceparent) == fresh
    child = fresh.child()
    assert child.trace_id == fresh.trace_id and child.span_id != fresh.span_id


@pytest.mark.pure
@pytest.mark.urls(__name__)
def test_incoming_traceparent_is_bound_for_logs_and_echoed(log_stream: io.StringIO) -> None:
    """The caller's trace id is in the view's log context and log lines, and comes back on the response."""
    response = Client().get("/ops-test/echo", HTTP_TRACEPARENT=INCOMING)
    assert response.status_code == 200
    body = response.json()
    assert body["context"]["trace_id"] == TRACE_ID
    assert body["trace_id"] == TRACE_ID
    echoed = tracing.parse_traceparent(response["traceparent"])
    assert echoed is not None and echoed.trace_id == TRACE_ID
    assert echoed.span_id != "00f067aa0ba902b7"  # this request's own span, child of the caller's
    lines = _lines(log_stream)
    view_line = next(line for line in lines if line["event"] == "inside the view")
    access_line = next(line for line in lines if line["logger"] == "notifier.access")
    assert view_line["trace_id"] == TRACE_ID
    assert access_line["trace_id"] == TRACE_ID
    assert access_line["status"] == 200 and access_line["http_route"] == "ops-test/echo"
    # Nothing stays bound after the request.
    assert bound_log_context() == {}


@pytest.mark.pure
@pytest.mark.urls(__name__)
def test_missing_or_invalid_traceparent_starts_a_new_trace() -> None:
    """Without a usable header, the response still carries a valid, fresh traceparent."""
    response = Client().get("/ops-test/echo", HTTP_TRACEPARENT="nonsense")
    ctx = tracing.parse_traceparent(response["traceparent"])
    assert ctx is not None
    assert response.json()["context"]["trace_id"] == ctx.trace_id != TRACE_ID


def _incoming() -> tracing.TraceContext:
    """Return the trace position of the INCOMING traceparent header."""
    ctx = tracing.parse_traceparent(INCOMING)
    assert ctx is not None
    return ctx


class _CountingTracer:
    """A tracer that records the name of every span it is asked to start, then starts it."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self.started: list[str] = []

    def start_span(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.started.append(name)
        return self.tracer.start_span(name, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tracer, name)


@pytest.fixture
def celery_spans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Return the names of the spans the Celery instrumentation starts during the test."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    instrumentor = CeleryInstrumentor()  # the instrumentation's one instance
    counting = _CountingTracer(instrumentor._tracer)
    monkeypatch.setattr(instrumentor, "_tracer", counting)
    return counting.started


def test_publish_puts_the_current_trace_in_the_message_headers(celery_spans: list[str]) -> None:
    """A task published inside a trace carries its traceparent as a message header on RabbitMQ.

    Without an exporter the Celery instrumentation makes no producer span: the header is a child position of
    the publisher's, in its trace.
    """
    assert tracing.configure_tracing(endpoint="") is False
    purge_all_queues()
    token = tracing.activate(_incoming())
    try:
        celery_app.send_task("notifier.retention.purge_old_deliveries", queue="maintenance")
    finally:
        tracing.deactivate(token)
        clear_log_context()
    with celery_app.connection_for_write() as conn:
        message = celery_app.amqp.queues["maintenance"](conn.channel()).get(no_ack=True)
    assert message is not None
    header = tracing.parse_traceparent(message.headers.get("traceparent"))
    assert header is not None and header.trace_id == TRACE_ID and header.span_id != _incoming().span_id
    assert celery_spans == []
    purge_all_queues()


@pytest.mark.pure
def test_worker_side_binds_the_task_trace_and_clears_it_after(celery_spans: list[str]) -> None:
    """task_prerun binds the task span's trace id (a child of the caller's) and task id; postrun clears them."""
    seen: dict[str, Any] = {}

    @celery_app.task(name="tests.ops.capture_context", bind=True)
    def capture(self: Any) -> None:
        seen.update(bound_log_context())
        seen["current"] = tracing.current_trace_id()

    token = tracing.activate(_incoming())
    clear_log_context()
    try:
        capture.apply(task_id="task-1")
    finally:
        celery_app.tasks.pop("tests.ops.capture_context", None)
        tracing.deactivate(token)
    assert seen["trace_id"] == TRACE_ID
    assert seen["current"] == TRACE_ID
    assert seen["span_id"] != "00f067aa0ba902b7"  # the task's own span
    assert seen["task_id"] == "task-1"
    assert bound_log_context() == {}
    assert tracing.current_trace() is None
    assert celery_spans == []  # no exporter: the task's position is made without a span


@pytest.mark.pure
def test_while_exporting_a_task_run_is_a_span_of_the_instrumentation_in_the_callers_trace(
    exporter: Any, celery_spans: list[str]
) -> None:
    """With an exporter the Celery instrumentation runs as before: the task's run is its consumer span."""

    @celery_app.task(name="tests.ops.traced")
    def traced() -> str:
        return tracing.current_trace_id()

    token = tracing.activate(_incoming())
    try:
        assert traced.apply(task_id="task-2").get() == TRACE_ID
    finally:
        celery_app.tasks.pop("tests.ops.traced", None)
        tracing.deactivate(token)
        clear_log_context()
    assert celery_spans == ["run/tests.ops.traced"]
    run = next(s for s in exporter.get_finished_spans() if s.name == "run/tests.ops.traced")
    assert run.kind.name == "CONSUMER" and format(run.context.trace_id, "032x") == TRACE_ID
    assert tracing.current_trace() is None


@pytest.mark.pure
def test_eager_run_restores_the_callers_context() -> None:
    """A task applied eagerly inside a request gets its own span and hands the caller's context back after."""
    caller = tracing.new_trace()
    token = tracing.activate(caller)

    inside: list[str] = []

    @celery_app.task(name="tests.ops.noop")
    def noop() -> None:
        inside.append(bound_log_context()["span_id"])

    try:
        noop.apply()
        assert len(inside) == 1 and inside[0] != caller.span_id
        assert tracing.current_trace() == caller
        assert bound_log_context()["trace_id"] == caller.trace_id
        assert bound_log_context()["span_id"] == caller.span_id
    finally:
        celery_app.tasks.pop("tests.ops.noop", None)
        tracing.deactivate(token)
        clear_log_context()


@pytest.fixture
def exporter() -> Iterator[Any]:
    """Export spans to memory for one test."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    assert tracing.configure_tracing(exporter=memory) is True
    yield memory
    tracing.reset_tracing()


@pytest.mark.pure
@pytest.mark.urls(__name__)
def test_without_an_exporter_nothing_is_recorded_but_ids_propagate() -> None:
    """No OTEL_EXPORTER_OTLP_ENDPOINT: configure_tracing is off, spans are not recorded, the trace id travels."""
    assert tracing.configure_tracing(endpoint="") is False
    with tracing.span("not recorded") as ctx:
        from opentelemetry import trace

        assert not trace.get_current_span().is_recording()
        assert tracing.current_trace_id() == ctx.trace_id != ""
    response = Client().get("/ops-test/echo", HTTP_TRACEPARENT=INCOMING)
    assert tracing.parse_traceparent(response["traceparent"]).trace_id == TRACE_ID


@pytest.mark.pure
def test_without_an_exporter_a_span_runs_in_the_current_trace_and_leaves_nothing_behind(
    log_stream: io.StringIO,
) -> None:
    """No span is made: the block's logs carry the caller's trace, or a new one's that ends with the block."""
    assert tracing.configure_tracing(endpoint="") is False
    clear_log_context()
    with tracing.span("publish email.high", kind="producer") as ctx:
        get_logger("notifier.test").info("outside any trace")
        assert tracing.current_trace() == ctx
    assert tracing.current_trace() is None and bound_log_context() == {}
    token = tracing.activate(_incoming())
    try:
        with tracing.span("publish email.high", kind="producer") as inner:
            get_logger("notifier.test").info("inside the request's trace")
        assert inner.trace_id == TRACE_ID
        assert tracing.current_trace() == _incoming() and bound_log_context()["trace_id"] == TRACE_ID
    finally:
        tracing.deactivate(token)
        clear_log_context()
    first, second = _lines(log_stream)
    assert first["trace_id"] == ctx.trace_id != TRACE_ID
    assert second["trace_id"] == TRACE_ID


@pytest.mark.pure
@pytest.mark.urls(__name__)
def test_the_django_instrumentations_middleware_runs_only_while_exporting(monkeypatch: Any) -> None:
    """In MIDDLEWARE the instrumentation's middleware stands behind a switch: off, a request never reaches it."""
    from django.conf import settings
    from opentelemetry.instrumentation.django.middleware.otel_middleware import _DjangoMiddleware

    assert "core.tracing.WhileExportingMiddleware" in settings.MIDDLEWARE
    assert tracing._OTEL_DJANGO_MIDDLEWARE not in settings.MIDDLEWARE
    calls: list[str] = []
    original = _DjangoMiddleware.process_request

    def counted(self: Any, request: Any) -> Any:
        calls.append(request.path)
        return original(self, request)

    monkeypatch.setattr(_DjangoMiddleware, "process_request", counted)
    assert tracing.configure_tracing(endpoint="") is False
    Client().get("/ops-test/echo", HTTP_TRACEPARENT=INCOMING)
    assert calls == []
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    try:
        assert tracing.configure_tracing(exporter=InMemorySpanExporter()) is True
        Client().get("/ops-test/echo", HTTP_TRACEPARENT=INCOMING)
        assert calls == ["/ops-test/echo"]
    finally:
        tracing.reset_tracing()


@pytest.mark.pure
@pytest.mark.urls(__name__)
def test_request_becomes_a_django_server_span_in_the_callers_trace(exporter: Any) -> None:
    """With an exporter, the Django instrumentation's server span continues the caller's trace; the response
    echoes that span."""
    response = Client().get("/ops-test/echo", HTTP_TRACEPARENT=INCOMING)
    spans = [s for s in exporter.get_finished_spans() if s.kind.name == "SERVER"]
    assert len(spans) == 1
    span = spans[0]
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    echoed = tracing.parse_traceparent(response["traceparent"])
    assert echoed is not None and echoed.span_id == format(span.context.span_id, "016x")
    status = span.attributes.get("http.response.status_code", span.attributes.get("http.status_code"))
    assert status == 200


@pytest.mark.pure
def test_probes_make_no_spans(exporter: Any) -> None:
    """/healthz is excluded from the instrumentation; its logs still get a trace id."""
    response = Client().get("/healthz")
    assert response.status_code == 200, response.content
    assert tracing.parse_traceparent(response["traceparent"]) is not None
    assert not [s for s in exporter.get_finished_spans() if s.kind.name == "SERVER"]


@pytest.mark.django_db(transaction=True)
def test_provider_call_and_publish_spans_reach_the_exporter_in_one_trace(exporter: Any, api: Any) -> None:
    """End to end in one trace: the API request, its publish span, the Celery publish with the trace in the
    message header, the task run continuing it, the provider-call span, and database and Redis spans."""
    from channels_app.tasks import send_deliveries
    from notifier.deliveries.models import Delivery
    from preferences.services import recipient_upsert
    from templates_app.services import template_put

    purge_all_queues()
    template_put(
        key="otp-trace",
        category="security",
        default_locale="en",
        content={"en": {"email": {"subject": "Code", "text": "Your code is {{ code }}"}}},
    )
    recipient_upsert(user_id="u-trace", email="trace@example.com")
    response = api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": "u-trace"}, "category": "security", "template": "otp-trace", "payload": {"code": 7}},
        format="json",
        HTTP_TRACEPARENT=INCOMING,
    )
    assert response.status_code == 202, response.content
    # The API publishes from its background coalescer thread, continuing the request's trace.
    from notifier.deliveries.outbox import coalescer

    assert coalescer.wait_idle()
    delivery = response.json()["deliveries"][0]
    queue = f"{delivery['channel']}.high"
    with celery_app.connection_for_write() as conn:
        message = celery_app.amqp.queues[queue](conn.channel()).get(no_ack=True)
    assert message is not None
    header = tracing.parse_traceparent(message.headers.get("traceparent"))
    assert header is not None and header.trace_id == TRACE_ID
    # The worker side, in this process so its spans reach the same exporter, continuing the message's header
    # as a worker does (test_observability_e2e checks a real worker logs the same trace id).
    args, _kwargs, _embed = message.decode()
    token = tracing.activate(header)
    try:
        send_deliveries.apply(args=args, task_id="trace-task")
    finally:
        tracing.deactivate(token)
        clear_log_context()
    purge_all_queues()

    spans = exporter.get_finished_spans()
    by_name = {s.name: s for s in spans}
    publish = by_name[f"publish {queue}"]
    assert publish.kind.name == "PRODUCER"
    assert publish.attributes["messaging.destination.name"] == queue
    provider = next(s for s in spans if s.name.startswith("provider.send_batch "))
    assert provider.kind.name == "CLIENT" and provider.attributes["notifier.provider"] == "sandbox"
    for span in (publish, provider):
        assert format(span.context.trace_id, "032x") == TRACE_ID, span.name
    assert Delivery.objects.get(pk=delivery["id"]).status == "sent"
    assert any(s.name.startswith("apply_async/") for s in spans)  # Celery instrumentation
    assert any(s.name == "run/channels_app.tasks.send_deliveries" for s in spans)
    database = [s for s in spans if s.instrumentation_scope.name == "opentelemetry.instrumentation.psycopg"]
    assert database and all(s.attributes["db.system"] == "postgresql" for s in database)
    assert any(s.name in ("SELECT", "UPDATE", "INSERT") for s in database)
    assert any(s.attributes.get("db.system") == "redis" or s.name.startswith(("EVALSHA", "GET", "SET")) for s in spans)


@pytest.fixture
def sampled_exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Return a function that sets the standard sampler switches and exports to memory under them."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    def configure(sampler: str | None, arg: str | None = None) -> Any:
        memory = InMemorySpanExporter()  # a replaced exporter is shut down
        for name, value in (("OTEL_TRACES_SAMPLER", sampler), ("OTEL_TRACES_SAMPLER_ARG", arg)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        assert tracing.configure_tracing(exporter=memory) is True
        return memory

    yield configure
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    monkeypatch.delenv("OTEL_TRACES_SAMPLER_ARG", raising=False)
    tracing.reset_tracing()


def _root_traces(count: int) -> set[str]:
    """Start `count` new traces of a parent and a child span each; return their trace ids."""
    clear_log_context()
    ids = set()
    for index in range(count):
        with tracing.span("sampled root", index=index) as ctx:
            with tracing.span("sampled child"):
                pass
        ids.add(ctx.trace_id)
    clear_log_context()
    return ids


@pytest.mark.pure
@pytest.mark.urls(__name__)
def test_always_off_records_nothing(sampled_exporter: Any) -> None:
    """OTEL_TRACES_SAMPLER=always_off: no span is recorded, not even for a caller that asked for sampling, and
    the trace id still propagates to the response."""
    memory = sampled_exporter("always_off")
    assert len(_root_traces(50)) == 50
    response = Client().get("/ops-test/echo", HTTP_TRACEPARENT=INCOMING)
    assert tracing.parse_traceparent(response["traceparent"]).trace_id == TRACE_ID
    assert memory.get_finished_spans() == ()


@pytest.mark.pure
def test_traceidratio_half_records_about_half_of_the_traces(sampled_exporter: Any) -> None:
    """traceidratio with OTEL_TRACES_SAMPLER_ARG=0.5 records about half of 400 traces (binomial: 35-65 % is
    six standard deviations either side), and a recorded trace is recorded whole."""
    memory = sampled_exporter("traceidratio", "0.5")
    started = _root_traces(400)
    spans = memory.get_finished_spans()
    recorded = {format(s.context.trace_id, "032x") for s in spans}
    assert recorded <= started
    assert 0.35 * 400 <= len(recorded) <= 0.65 * 400, len(recorded)
    assert len(spans) == 2 * len(recorded)  # the child follows its root's decision


@pytest.mark.pure
@pytest.mark.urls(__name__)
def test_default_sampler_follows_the_callers_flag(sampled_exporter: Any) -> None:
    """Unset switches mean parentbased_always_on: a caller's unsampled traceparent records nothing, a sampled
    one records the request, a new trace records everything."""
    memory = sampled_exporter(None)
    Client().get("/ops-test/echo", HTTP_TRACEPARENT=INCOMING[:-2] + "00")
    assert [s for s in memory.get_finished_spans() if s.kind.name == "SERVER"] == []
    Client().get("/ops-test/echo", HTTP_TRACEPARENT=INCOMING)
    assert [format(s.context.trace_id, "032x") for s in memory.get_finished_spans()] == [TRACE_ID]
    assert len(_root_traces(20)) == 20
    assert len(memory.get_finished_spans()) == 1 + 40


@pytest.mark.pure
def test_a_bad_sampler_switch_falls_back_to_the_default(sampled_exporter: Any) -> None:
    """An unknown sampler name or a ratio that is not a number is not fatal: the SDK's default applies."""
    sampled_exporter("sometimes")
    assert "ParentBased{root:AlwaysOnSampler," in tracing._sampler.get_description()
    memory = sampled_exporter("traceidratio", "half")
    assert len(_root_traces(10)) == 10
    assert len(memory.get_finished_spans()) == 20  # ratio 1.0


@pytest.mark.django_db
def test_database_statements_pass_the_psycopg_instrumentation_only_while_exporting(exporter: Any) -> None:
    """While exporting, a statement is a psycopg span (operation as its name, no parameter values); once the
    exporter is gone the connection's cursors are Django's own again, so no statement builds a span."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::text", ["secret-value"])
    database = [s for s in exporter.get_finished_spans() if s.attributes.get("db.system") == "postgresql"]
    assert [s.name for s in database] == ["SELECT"]
    assert "secret-value" not in repr(dict(database[0].attributes))
    # A statement's text is cut (a bulk INSERT's runs to megabytes).
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 WHERE %s <> '" + "x" * 5000 + "'", ["a"])
    long = [s for s in exporter.get_finished_spans() if s.attributes.get("db.system") == "postgresql"][-1]
    text = long.attributes.get("db.statement", long.attributes.get("db.query.text"))
    assert text.startswith("SELECT 1 WHERE") and len(text) == 2048
    traced = type(connection.connection.cursor())
    tracing.reset_tracing()
    plain = type(connection.connection.cursor())
    assert plain is not traced and issubclass(traced, plain)
    assert plain is connection.get_connection_params()["cursor_factory"]
    assert tracing.configure_tracing(exporter=exporter) is True
    assert type(connection.connection.cursor()) is traced


def test_the_stream_servers_async_connections_are_left_untraced(exporter: Any) -> None:
    """psycopg's async connections (the inbox stream server's polls) make no span even while exporting."""
    import asyncio

    import psycopg

    from tests.conftest import test_database_url

    async def poll() -> Any:
        async with await psycopg.AsyncConnection.connect(test_database_url(), autocommit=True) as conn:
            cursor = await conn.execute("SELECT 1")
            return type(cursor), await cursor.fetchone()

    cursor_class, row = asyncio.run(poll())
    assert row == (1,) and cursor_class is psycopg.AsyncCursor
    assert not [s for s in exporter.get_finished_spans() if s.attributes.get("db.system") == "postgresql"]
