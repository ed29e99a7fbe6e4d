"""Progress of long work: a bar on a terminal, plain lines every few seconds otherwise.

A management command that can run for minutes wraps its work in `reporting(self.stderr)`; the library code it
calls (an export, a restore, a replay, a partition drop) reports through `task(...)` whatever calls it, and
reports nothing at all when no command is watching (a Celery task, a test), so the same code serves both:

    with progress.task(f"export {table} {day}", total=estimate, unit="rows") as work:
        for batch in batches:
            ...
            work.advance(len(batch))

On a terminal the line is a bar redrawn in place (rows, rate, time left); otherwise (a pipe, a log
collector, `kubectl logs`) a start line, a plain line every PROGRESS_INTERVAL_SECONDS with the same counts,
and a closing line, each flushed as it is written. Progress goes to stderr: stdout keeps the command's result
for scripts.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

# A terminal redraws at most this often: a redraw per batch of a fast loop would cost more than the batch.
_REDRAW_SECONDS = 0.2
_DEFAULT_INTERVAL_SECONDS = 10.0
_BAR_WIDTH = 24


class _Stream(Protocol):
    def write(self, text: str, /) -> Any: ...

    def flush(self) -> Any: ...


def _raw(stream: Any) -> Any:
    # Django's OutputWrapper (a command's self.stdout / self.stderr) appends a newline to every write and
    # colours stderr: the bar needs the plain file object it wraps.
    return getattr(stream, "_out", stream)


def _is_tty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed file
        return False


def _interval() -> float:
    from django.conf import settings

    return float(getattr(settings, "PROGRESS_INTERVAL_SECONDS", _DEFAULT_INTERVAL_SECONDS))


def _duration(seconds: float) -> str:
    """Return `seconds` as h:mm:ss or m:ss."""
    seconds = max(0, int(seconds + 0.5))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Task:
    """One piece of long work being counted: `advance(n)` as units are done."""

    def __init__(
        self, reporter: Reporter | None, label: str, total: int | None, unit: str, *, estimated: bool = False
    ) -> None:
        self.reporter = reporter
        self.label = label
        self.total = total if total is None or total > 0 else None
        self.unit = unit
        self.estimated = estimated
        self.done = 0
        self.started = reporter.clock() if reporter else 0.0

    def advance(self, count: int = 1) -> None:
        """Count `count` more units done (and report, if it is time to)."""
        self.done += count
        if self.reporter is not None:
            self.reporter.advanced(self)

    def summary(self, now: float) -> str:
        """Return the counts, rate and time left as one line of text (no bar)."""
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        total = self.total if self.total is not None and self.done <= self.total else None
        mark = "~" if self.estimated else ""
        parts = [f"{self.done:,}/{mark}{total:,} {self.unit}" if total else f"{self.done:,} {self.unit}"]
        if total:
            parts[0] += f" ({100 * self.done / total:.0f} %)"
        parts.append(f"{rate:,.0f} {self.unit}/s")
        if total and rate > 0:
            parts.append(f"{_duration((total - self.done) / rate)} left")
        else:
            parts.append(f"{_duration(elapsed)} so far")
        return ", ".join(parts)


class Reporter:
    """Write the progress of the tasks started under it to one stream: a bar on a TTY, plain lines otherwise."""

    def __init__(
        self,
        stream: _Stream,
        *,
        tty: bool | None = None,
        interval_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.tty = _is_tty(stream) if tty is None else tty
        self.interval = _interval() if interval_seconds is None else interval_seconds
        self.clock = clock
        self._last_write = 0.0
        self._drawn = False

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
        self._last_write = self.clock()

    def started(self, task: Task) -> None:
        """Announce a task (plain lines only: a bar appears with its first count)."""
        if not self.tty:
            size = f" ({'~' if task.estimated else ''}{task.total:,} {task.unit})" if task.total else ""
            self._write(f"{task.label}: started{size}\n")

    def advanced(self, task: Task) -> None:
        """Report a task's new count if the last report is old enough."""
        now = self.clock()
        if self.tty:
            if now - self._last_write >= _REDRAW_SECONDS or not self._drawn:
                self._draw(task, now)
        elif now - self._last_write >= self.interval:
            self._write(f"{task.label}: {task.summary(now)}\n")

    def finished(self, task: Task, error: BaseException | None) -> None:
        """Close a task's report: the bar's last state on its own line, or a closing plain line."""
        now = self.clock()
        if self.tty:
            self._draw(task, now)
            self._write("\n")
            self._drawn = False
        elapsed = _duration(now - task.started)
        if error is not None:
            self._write(f"{task.label}: stopped after {task.done:,} {task.unit} ({elapsed}): {type(error).__name__}\n")
        elif not self.tty:
            rate = task.done / max(now - task.started, 1e-9)
            self._write(f"{task.label}: done, {task.done:,} {task.unit} in {elapsed} ({rate:,.0f} {task.unit}/s)\n")

    def _draw(self, task: Task, now: float) -> None:
        total = task.total if task.total is not None and task.done <= task.total else None
        if total:
            filled = int(_BAR_WIDTH * task.done / total)
            bar = "█" * filled + "░" * (_BAR_WIDTH - filled)
        else:  # no total: a marker that moves, so the line shows life
            position = task.done % _BAR_WIDTH
            bar = "░" * position + "█" + "░" * (_BAR_WIDTH - position - 1)
        line = f"{task.label} |{bar}| {task.summary(now)}"
        width = shutil.get_terminal_size((120, 24)).columns
        self._write("\r" + line[: max(width - 1, 20)] + "\x1b[K")
        self._drawn = True


_current: ContextVar[Reporter | None] = ContextVar("notifier_progress", default=None)


@contextmanager
def reporting(stream: Any, *, tty: bool | None = None, interval_seconds: float | None = None) -> Iterator[Reporter]:
    """Report the progress of every `task` started inside the block to `stream` (a command's self.stderr)."""
    reporter = Reporter(_raw(stream), tty=tty, interval_seconds=interval_seconds)
    token = _current.set(reporter)
    try:
        yield reporter
    finally:
        _current.reset(token)


def watching() -> bool:
    """Return whether progress is being reported (worth counting a total that costs a query)."""
    return _current.get() is not None


@contextmanager
def task(label: str, *, total: int | None = None, unit: str = "rows", estimated: bool = False) -> Iterator[Task]:
    """Count one piece of long work; reported only inside `reporting` (elsewhere the counting costs nothing).

    `total` may be unknown (None) or an estimate (`estimated`, shown with "~"; a count past it drops the
    percentage rather than showing more than 100 %).
    """
    reporter = _current.get()
    work = Task(reporter, label, total, unit, estimated=estimated)
    if reporter is None:
        yield work
        return
    reporter.started(work)
    try:
        yield work
    except BaseException as exc:
        reporter.finished(work, exc)
        raise
    reporter.finished(work, None)
