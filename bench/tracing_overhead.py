"""What tracing costs a database statement: off, the instrumentation's cursor with spans dropped, exporting.

    BENCH_NS=me .venv/bin/python bench/tracing_overhead.py [--statements 20000] [--keep]

`SELECT 1` through Django's connection, `--statements` times per case, in one process on the bench database
(`bench_notifier_<BENCH_NS>`, created and dropped):

1. no exporter (production default): the connection has Django's own cursor class;
2. the psycopg instrumentation's traced cursor in the path while the sampler drops every span, which is what
   an always-installed instrumentation would cost without an exporter (forced here for the comparison);
3. exporting to memory under the default sampler (a span per statement, recorded and processed);
4. exporting under `OTEL_TRACES_SAMPLER=traceidratio`, `OTEL_TRACES_SAMPLER_ARG=0.1`, each statement its own
   trace (a tenth recorded).

Prints microseconds per statement for each (the median of `--rounds` rounds, the cases interleaved round by
round) and the spans each produced. Then the same for the span of a publish of delivery ids (`tracing.span`, one
per message the API's publisher sends) inside a request's trace: with no exporter (no span is made), a span the
sampler drops (what no exporter cost while every publish made one), and exporting. Last, Celery's side: a task
run (`task.apply()` of a task that does nothing, inside a trace) and a publish's two signals (what Celery sends
around every message), with the Celery instrumentation behind its switch and no exporter (no span is made),
with its handlers always in the path as before (their spans dropped), and exporting.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import cleanup, log, parser, prepare


def _round(n: int) -> float:
    """Run `n` statements; return microseconds per statement."""
    from django.db import connection

    started = time.perf_counter()
    for _ in range(n):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    return (time.perf_counter() - started) / n * 1e6


def _span_round(n: int, *, dropped: bool = False) -> float:
    """Run `n` publish spans inside a request's trace; return microseconds per span.

    `dropped`: an OpenTelemetry span from a tracer built for it, dropped by the sampler and bound for logs, as
    `tracing.span` made one for every publish whether or not anything exported.
    """
    from core import tracing
    from core.logs import bind_delivery_context

    attributes: dict[str, str | int] = {"messaging.destination.name": "email.high", "notifier.deliveries": 1}
    token = tracing.activate(tracing.new_trace())
    try:
        started = time.perf_counter()
        for _ in range(n):
            if dropped:
                otel_tracer = tracing._provider().get_tracer("notifier")
                with otel_tracer.start_as_current_span("publish email.high", attributes=attributes) as otel_span:
                    ctx = tracing._from_span_context(otel_span.get_span_context())
                    with bind_delivery_context(trace_id=ctx.trace_id, span_id=ctx.span_id):
                        pass
            else:
                with tracing.span("publish email.high", kind="producer", **attributes):
                    pass
        return (time.perf_counter() - started) / n * 1e6
    finally:
        tracing.deactivate(token)


def _celery_round(n: int, task: Any) -> tuple[float, float]:
    """Run `task` eagerly `n` times, then send a publish's two signals `n` times; return µs per run and publish.

    The signals as Celery sends them around a message (celery/app/amqp.py, send_task_message).
    """
    from celery import signals

    from core import tracing

    token = tracing.activate(tracing.new_trace())
    try:
        started = time.perf_counter()
        for _ in range(n):
            task.apply()
        runs = (time.perf_counter() - started) / n * 1e6
        body: tuple[Any, ...] = ([[1]], {}, {})
        started = time.perf_counter()
        for i in range(n):
            headers = {"id": f"bench-{i}", "task": task.name}
            signals.before_task_publish.send(
                sender=task.name, body=body, exchange="notifier", routing_key="email.high", headers=headers,
                properties={}, declare=[], retry_policy=None,
            )  # fmt: skip
            signals.after_task_publish.send(
                sender=task.name, body=body, headers=headers, exchange="notifier", routing_key="email.high"
            )
        return runs, (time.perf_counter() - started) / n * 1e6
    finally:
        tracing.deactivate(token)


@contextmanager
def _celery_instrumentation_always_on() -> Iterator[None]:
    """Put the Celery instrumentation's own handlers back in place of their switch, as before it existed."""
    from core import tracing

    gates = tracing._state["celery"].gates
    for signal, handler, gate in gates:
        signal.disconnect(gate)
        signal.connect(handler, weak=False)
    try:
        yield
    finally:
        for signal, handler, gate in gates:
            signal.disconnect(handler)
            signal.connect(gate, weak=False)


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--statements", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args()
    prepare(broker=False)
    try:
        from django.db import connection
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from core import tracing

        per_round = max(1, args.statements // args.rounds)
        connection.ensure_connection()
        cases = [
            ("1. no exporter, Django's cursor", None, None),
            ("2. traced cursor, spans dropped", "forced", None),
            ("3. exporting, parentbased_always_on", "parentbased_always_on", ""),
            ("4. exporting, traceidratio 0.1", "traceidratio", "0.1"),
        ]
        times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        spans: dict[str, int] = dict.fromkeys(times, 0)
        _round(per_round)  # warm up: the connection, the code paths
        # Rounds interleaved (1 2 3 4 1 2 3 4 ...): the load of a shared box drifts, and each case sees it alike.
        for _ in range(args.rounds):
            for name, sampler, arg in cases:
                memory = InMemorySpanExporter()
                if sampler == "forced":
                    tracing._switch_database_cursors(True)
                elif sampler is not None:
                    os.environ["OTEL_TRACES_SAMPLER"], os.environ["OTEL_TRACES_SAMPLER_ARG"] = sampler, arg or ""
                    tracing.configure_tracing(exporter=memory)
                times[name].append(_round(per_round))
                spans[name] += len(memory.get_finished_spans())
                tracing.reset_tracing()
        plain = statistics.median(times[cases[0][0]])
        total = per_round * args.rounds
        for name, _, _ in cases:
            cost = statistics.median(times[name])
            log(f"{name}: {cost:.1f} µs a statement (+{cost - plain:.1f} µs), {spans[name]:,} spans of {total:,}")

        publish: dict[str, list[float]] = {"no exporter": [], "a dropped span": [], "exporting": []}
        for _ in range(args.rounds):
            publish["no exporter"].append(_span_round(per_round))
            publish["a dropped span"].append(_span_round(per_round, dropped=True))
            tracing.configure_tracing(exporter=InMemorySpanExporter())
            publish["exporting"].append(_span_round(per_round))
            tracing.reset_tracing()
        for name, values in publish.items():
            log(f"publish span, {name}: {statistics.median(values):.1f} µs")

        from config.celery import app

        @app.task(name="bench.noop")
        def noop() -> None:
            """Do nothing: what is timed is Celery's and the instrumentation's work around a run."""

        celery: dict[str, list[tuple[float, float]]] = {"no exporter": [], "handlers always on": [], "exporting": []}
        for _ in range(args.rounds):
            celery["no exporter"].append(_celery_round(per_round // 4, noop))
            with _celery_instrumentation_always_on():
                celery["handlers always on"].append(_celery_round(per_round // 4, noop))
            tracing.configure_tracing(exporter=InMemorySpanExporter())
            celery["exporting"].append(_celery_round(per_round // 4, noop))
            tracing.reset_tracing()
        for name, pairs in celery.items():
            run = statistics.median(r for r, _ in pairs)
            sent = statistics.median(p for _, p in pairs)
            log(f"Celery, {name}: a task run {run:.1f} µs, a publish's signals {sent:.1f} µs")
    finally:
        cleanup(args.keep, broker=False)


if __name__ == "__main__":
    main()
