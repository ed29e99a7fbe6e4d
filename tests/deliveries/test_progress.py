"""Progress of long commands (core/progress.py): plain lines through a pipe, a bar on a terminal, silence in tasks.

The commands run as real processes: `archive_day` with its stderr on a pipe (its lines are read while it still
runs) and `restore_day` under a pseudo-terminal (the bar), against moto's S3 and the test database.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import pty
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from core import progress
from notifier.deliveries import archive, partitions
from tests.conftest import BROKER_URL, REDIS_PREFIX, HandClock, test_database_url
from tests.deliveries.test_archive import bucket  # noqa: F401  (the archive's bucket fixture)
from tests.factories import make_dead_letter, make_delivery, move_to_day
from tests.stubs import aws

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.pure
def test_plain_lines_come_every_interval_with_counts_rate_and_time_left() -> None:
    """Not a terminal: a start line, a line once the interval has passed (not per advance), a closing line."""
    out, clock = io.StringIO(), HandClock()
    reporter = progress.Reporter(out, tty=False, interval_seconds=10, clock=clock)
    token = progress._current.set(reporter)
    try:
        with progress.task("export deliveries", total=1000) as work:
            for _ in range(4):
                clock.now += 2.5
                work.advance(100)  # 100 rows every 2.5 s: 40 rows/s
            clock.now += 1
            work.advance(100)
    finally:
        progress._current.reset(token)
    lines = out.getvalue().splitlines()
    assert lines[0] == "export deliveries: started (1,000 rows)"
    assert lines[1] == "export deliveries: 400/1,000 rows (40 %), 40 rows/s, 0:15 left"
    assert lines[2].startswith("export deliveries: done, 500 rows in 0:11 (")
    assert len(lines) == 3


@pytest.mark.pure
def test_the_bar_redraws_in_place_with_percentage_rate_and_time_left() -> None:
    """On a terminal: carriage returns and a bar, not a line per advance; the last state stays on its own line."""
    out, clock = io.StringIO(), HandClock()
    reporter = progress.Reporter(out, tty=True, clock=clock)
    token = progress._current.set(reporter)
    try:
        with progress.task("restore t", total=150) as work:
            for _ in range(15):
                clock.now += 0.125
                work.advance(5)  # redrawn every 0.2 s (every other advance), not on each of these
            clock.now += 0.5
            work.advance(75)
    finally:
        progress._current.reset(token)
    text = out.getvalue()
    draws = text.split("\r")[1:]
    assert 8 <= len(draws) <= 11, len(draws)
    assert "\n" not in text.rstrip("\n")  # one line, redrawn
    last = draws[-1]
    assert last.startswith("restore t |" + "█" * 24 + "| 150/150 rows (100 %)"), last
    assert "rows/s" in last and last.endswith("0:00 left\x1b[K\n")
    middle = next(d for d in draws if "75/150" in d)
    assert "|" + "█" * 12 + "░" * 12 + "| 75/150 rows (50 %)" in middle


@pytest.mark.pure
def test_an_estimate_is_marked_and_never_shows_more_than_all() -> None:
    """An estimated total is shown with "~"; a count past it drops the percentage instead of exceeding 100 %."""
    out, clock = io.StringIO(), HandClock()
    token = progress._current.set(progress.Reporter(out, tty=False, interval_seconds=0, clock=clock))
    try:
        with progress.task("archive x", total=10, estimated=True) as work:
            clock.now += 1
            work.advance(5)
            clock.now += 1
            work.advance(10)
    finally:
        progress._current.reset(token)
    lines = out.getvalue().splitlines()
    assert lines[0] == "archive x: started (~10 rows)"
    assert lines[1].startswith("archive x: 5/~10 rows (50 %), 5 rows/s, 0:01 left")
    assert lines[2].startswith("archive x: 15 rows, 8 rows/s, 0:02 so far")


@pytest.mark.pure
def test_an_error_ends_the_report_with_what_was_done() -> None:
    """Work that raises says how far it got, then the error goes on."""
    out = io.StringIO()
    with progress.reporting(out, tty=False, interval_seconds=60), pytest.raises(RuntimeError):
        with progress.task("replay", total=3, unit="dead letters") as work:
            work.advance(2)
            raise RuntimeError("broker gone")
    assert out.getvalue().splitlines()[-1].startswith("replay: stopped after 2 dead letters (0:00): RuntimeError")


@pytest.mark.pure
def test_outside_a_command_nothing_is_reported() -> None:
    """A Celery task or a test runs the same code with no reporter: the counting writes nowhere."""
    assert not progress.watching()
    with progress.task("silent", total=5) as work:
        work.advance(5)
    assert work.done == 5 and work.reporter is None


@pytest.mark.django_db
def test_replay_command_reports_its_progress(settings: Any, django_capture_on_commit_callbacks: Any) -> None:
    """`replay_dead_letters --all` counts the pending dead letters and reports each chunk on stderr."""
    settings.PROGRESS_INTERVAL_SECONDS = 0
    for _ in range(3):
        make_dead_letter(delivery=make_delivery(status="failed"))
    out, err = io.StringIO(), io.StringIO()
    with django_capture_on_commit_callbacks(execute=False):
        call_command("replay_dead_letters", "--all", stdout=out, stderr=err)
    lines = err.getvalue().splitlines()
    assert lines[0] == "replay dead letters: started (3 dead letters)"
    assert lines[1].startswith("replay dead letters: 3/3 dead letters (100 %)")
    assert lines[-1].startswith("replay dead letters: done, 3 dead letters in ")
    assert "3 delivery(ies) replayed." in out.getvalue()  # the result stays on stdout


def _command_env(settings: Any, **extra: str) -> dict[str, str]:
    """Return the environment of a manage.py process on this test database, broker, Redis prefix and bucket."""
    return {
        **os.environ,
        "DATABASE_URL": test_database_url(),
        "CELERY_BROKER_URL": BROKER_URL,
        "REDIS_KEY_PREFIX": REDIS_PREFIX,
        "ARCHIVE_BUCKET": settings.ARCHIVE_BUCKET,
        "ARCHIVE_PREFIX": settings.ARCHIVE_PREFIX,
        "ARCHIVE_S3_ENDPOINT_URL": settings.ARCHIVE_S3_ENDPOINT_URL,
        "ARCHIVE_S3_REGION": aws.REGION,
        "ARCHIVE_AWS_ACCESS_KEY_ID": aws.ACCESS_KEY,
        "ARCHIVE_AWS_SECRET_ACCESS_KEY": aws.SECRET_KEY,
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


# One of the days made ahead, which have partitions of their own (notifier/deliveries/partitions.py).
DAY = (timezone.now() + dt.timedelta(days=4)).astimezone(dt.UTC).date()
NOON = dt.datetime(DAY.year, DAY.month, DAY.day, 12, tzinfo=dt.UTC)


def _a_day_of(count: int) -> None:
    for index in range(count):
        move_to_day(make_delivery(provider_message_id=f"p-{index}"), NOON)
    with connection.cursor() as cursor:  # the planner's estimate is the export's total
        cursor.execute(f"ANALYZE {partitions.partition_name(partitions.DELIVERY, DAY)}")


@pytest.fixture
def day_cleanup() -> Iterator[None]:
    """Remove the day's rows and restored tables afterwards."""
    yield
    archive.restore_drop(DAY)
    with connection.cursor() as cursor:
        for table in (partitions.EVENT, partitions.DELIVERY, partitions.NOTIFICATION):
            cursor.execute(
                f"DELETE FROM {table} WHERE {partitions.day_filter(table, DAY)[0]}", partitions.day_bounds(table, DAY)
            )


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("bucket", "day_cleanup")
def test_archive_day_through_a_pipe_writes_counted_lines_while_it_runs(settings: Any) -> None:
    """stderr a pipe: plain lines with counts arrive while the command still runs; the result is on stdout."""
    _a_day_of(40)
    env = _command_env(settings, ARCHIVE_BATCH_ROWS="1", PROGRESS_INTERVAL_SECONDS="0")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "archive_day", DAY.isoformat()],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None and proc.stdout is not None
    lines, running_at_first_count = [], None
    for line in proc.stderr:
        lines.append(line.rstrip("\n"))
        if running_at_first_count is None and re.match(r"archive delivery \S+: \d+/~40 rows", line):
            running_at_first_count = proc.poll() is None
    stdout = proc.stdout.read()
    assert proc.wait(timeout=120) == 0, "\n".join(lines)
    assert running_at_first_count is True, "\n".join(lines)
    assert f"archive delivery {DAY.isoformat()}: started (~40 rows)" in lines
    counts = [int(m.group(1)) for m in (re.match(r"archive delivery \S+: (\d+)/", x) for x in lines) if m]
    assert counts == sorted(counts) and counts[-1] == 40 and len(counts) >= 20
    assert any(re.match(r"archive delivery \S+: done, 40 rows in ", x) for x in lines)
    assert "delivery: 40 rows" in stdout and "archived" in stdout
    assert not any("\r" in x for x in lines)  # no bar on a pipe


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("bucket", "day_cleanup")
def test_restore_day_under_a_terminal_draws_a_bar(settings: Any) -> None:
    """A pseudo-terminal: the command draws a bar (carriage returns, blocks, percentage, rate, time left)."""
    _a_day_of(5)
    archive.archive_day(DAY)
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "restore_day", DAY.isoformat()],
        cwd=ROOT, env=_command_env(settings, COLUMNS="200"), stdin=secondary, stdout=secondary, stderr=secondary,
    )  # fmt: skip
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert proc.wait(timeout=120) == 0
    text = b"".join(chunks).decode()
    name = archive.restored_table_name("delivery", DAY)
    bar = re.search(rf"\r{re.escape('restore ' + name)} \|(█+)\| 5/5 rows \(100 %\), [\d,]+ rows/s, 0:00 left", text)
    assert bar is not None and len(bar.group(1)) == 24, text
    assert "started" not in text  # no plain lines on a terminal
    assert f"{DAY.isoformat()} restored (read-only)." in text
