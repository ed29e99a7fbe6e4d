"""Where a process's Python time goes, by stage: py-spy samples of the thread holding the GIL, bucketed.

Sampling only the thread that holds the GIL counts what the process spends running Python (and the C it calls
holding the GIL: psycopg's and redis-py's parsing, JSON), not its threads waiting on a socket, a lock or a sleep,
which a plain sample of every thread counts as busy. A sample belongs to the innermost frame that matches a
stage, so a stage's share is its own work, not that of the code it calls into that belongs to another stage.

py-spy slows the process it samples (about 2x here at 200 samples a second), so figures taken with it are read as
shares, never as CPU per single.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

LOGS_METRICS_TRACING = ("core/logs.py", "core/metrics.py", "core/tracing.py", "prometheus_client/", "logging/")
OTHER_OBSERVERS = ("opentelemetry/", "structlog/")
# The send worker's stages, innermost first where one sits inside another. Celery's per-message work is what a
# message costs before and after the task body: the consumer's event loop (AMQP frames, the ack), the strategy
# that makes a request, the thread pool's hand-off, and the task tracer with its signals.
SEND_WORKER_STAGES: Sequence[tuple[str, Sequence[str]]] = (
    ("provider call", ("channels_app/providers/", "channels_app/sandbox.py")),
    ("render", ("channels_app/renderings.py", "templates_app/", "jinja2/")),
    ("redis (breaker, limiter, generation)", ("redis/",)),
    ("database (claim, loads, outcomes, events)", ("psycopg", "django/db/")),
    ("gather (messages waiting behind)", ("channels_app/gather.py",)),
    ("logs, metrics, tracing", LOGS_METRICS_TRACING + OTHER_OBSERVERS),
    ("pipeline (claim to outcome, Python)", ("channels_app/", "notifier/", "core/")),
    ("celery per message (tracer, signals)", ("celery/app/trace.py", "celery/utils/dispatch/")),
    ("celery per message (consumer, request, pool)", ("celery/", "kombu/", "amqp/", "concurrent/futures/")),
)


# The API's stages, innermost first. The floor (bench/floor_app.py) pays gunicorn, Django's handler and a statement
# too; everything else is what the send endpoint adds to it.
API_STAGES: Sequence[tuple[str, Sequence[str]]] = (
    ("publisher thread (outbox)", ("notifier/deliveries/outbox.py",)),
    ("redis (rate limit, dedup claims)", ("redis/",)),
    ("database driver (group statements, publisher's mark)", ("psycopg", "django/db/")),
    ("group commit and write", ("core/group_commit.py", "notifier/accepting/write.py", "notifier/deliveries/")),
    ("body validation", ("core/lean.py", "notifier/accepting/serializers.py")),
    (
        "our middleware (request context, body limit, CORS)",
        ("notifier/clients/middleware.py", "core/bodies.py", "notifier/inbox/cors.py"),
    ),
    ("authentication and rate limit", ("notifier/clients/", "core/ratelimit.py", "core/config_cache.py")),
    ("accept: decide and plan", ("notifier/", "preferences/", "templates_app/", "projects/", "core/")),
    ("logs, metrics, tracing", LOGS_METRICS_TRACING + OTHER_OBSERVERS),
    ("DRF", ("rest_framework/",)),
    ("Django middleware", ("django/middleware/", "django/contrib/", "whitenoise/", "django/utils/deprecation.py")),
    ("Django handler, URLs, request and response", ("django/",)),
    ("JSON", ("json/", "orjson")),
    ("gunicorn", ("gunicorn/",)),
)


class GilProfile:
    """Record a process's GIL-holding samples for a while with py-spy; `shares` buckets them by stage."""

    def __init__(self, pid: int, seconds: float, rate: int = 200) -> None:
        self._pid = pid
        self._out = Path(tempfile.mkdtemp(prefix="notifier-gil-")) / "samples.txt"
        command = [
            shutil.which("py-spy") or str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "py-spy"),
            "record", "--gil", "--nonblocking", "--format", "raw", "--rate", str(rate),
            "--duration", str(max(1, int(seconds))), "--pid", str(pid), "--output", str(self._out),
        ]  # fmt: skip
        self._proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    @staticmethod
    def of_many(pids: Sequence[int], seconds: float) -> list[GilProfile]:
        """Start one recording per process (an API's gunicorn workers)."""
        return [GilProfile(pid, seconds) for pid in pids]

    @staticmethod
    def merged(profiles: Sequence[GilProfile], stages: Sequence[tuple[str, Sequence[str]]]) -> tuple[Counter[str], int]:
        """Return the samples per stage of several recordings together, and their total."""
        totals: Counter[str] = Counter()
        for profile in profiles:
            totals.update(profile.shares(stages)[0])
        return totals, sum(totals.values())

    def shares(self, stages: Sequence[tuple[str, Sequence[str]]]) -> tuple[Counter[str], int]:
        """Wait for the recording; return the samples per stage ("other" for the rest) and their total."""
        _, err = self._proc.communicate(timeout=600)
        if self._proc.returncode != 0 or not self._out.exists():
            raise RuntimeError(f"py-spy failed (it needs ptrace: run as root or with CAP_SYS_PTRACE): {err[-500:]}")
        totals: Counter[str] = Counter()
        for line in self._out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            totals[stage_of(stack.split(";"), stages)] += int(count)
        keep = os.environ.get("BENCH_PROFILE_KEEP")
        if keep:  # the raw stacks, for a look below the stages (`py-spy record --format raw`)
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(self._out, Path(keep) / f"{self._pid}.txt")
        shutil.rmtree(self._out.parent, ignore_errors=True)
        return totals, sum(totals.values())


def stage_of(frames: Sequence[str], stages: Sequence[tuple[str, Sequence[str]]]) -> str:
    """Return the stage of the innermost frame that matches one (py-spy's raw frames: `name (path:line)`).

    py-spy names a file by its path under the import root (`core/db.py`, `django/core/cache/__init__.py`), so a
    stage's pieces are path prefixes: `core/` is this project's, never Django's `django/core/`.
    """
    for frame in reversed(frames):
        where = frame.rpartition("(")[2]
        for name, pieces in stages:
            if where.startswith(tuple(pieces)):
                return name
    return "other"


def print_shares(title: str, totals: Counter[str], total: int) -> None:
    """Print each stage's share of the samples, largest first."""
    print(f"{title} ({total} samples of the thread holding the GIL):")
    for name, count in totals.most_common():
        print(f"  {100 * count / max(total, 1):5.1f} %  {name}")
