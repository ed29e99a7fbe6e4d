"""Where a command's CPU goes on the box, by kind of process: run it, sample /proc twice a second, print the split.

    python3 bench/suite_cpu.py -- make test
    python3 bench/suite_cpu.py -- .venv/bin/pytest -n 3 --dist loadgroup -m "not serial" -q

The standard library only, so it runs before `make test` has made the virtual environment (on a fresh clone).

Every process on the machine counts, not only the command's descendants: PostgreSQL's backends, the broker and
Redis run the command's work too, and so does whatever else is running (run it on a quiet box). A process is put in
a kind by its command line (the pytest workers, the servers and workers the tests start, PostgreSQL, RabbitMQ,
Chromium, ...). A process that exits between two samples loses its last half second, so short-lived processes are
undercounted a little. Printed: the command's wall time, the CPU seconds of each kind, their sum, and how busy that
kept the machine's cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
INTERVAL = 0.5
# (kind, what its command line or name contains), the first match wins.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("PostgreSQL", ("postgres",)),
    ("RabbitMQ", ("beam", "erl_child_setup", "inet_gethost")),
    ("Redis", ("redis-server", "redis-sentinel")),
    ("Chromium and chromedriver", ("chrom",)),
    ("servers and workers forked by the test zygote", ("tests.zygote",)),
    ("Celery workers and beat", ("celery",)),
    ("gunicorn and uvicorn", ("gunicorn", "uvicorn")),
    ("pytest-xdist workers (the tests' own Python)", ("exec(eval(sys.stdin",)),
    ("render children", ("templates_app.render_worker",)),
    ("schemathesis", ("/st ", "schemathesis")),
    ("lint, types, schema (ruff, mypy, spectacular)", ("ruff", "mypy", "spectacular")),
    ("node (TypeScript client)", ("node", "tsc", "npm")),
    ("pytest, main process", ("pytest",)),
    ("manage.py commands", ("manage.py",)),
)


def _kind(pid: str) -> str | None:
    try:
        line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    if not line:
        return "kernel threads"
    text = f"{name} {line}"
    return next((kind for kind, marks in KINDS if any(mark in text for mark in marks)), "other")


def _ticks(pid: str) -> tuple[str, int] | None:
    """Return (start time, user + system ticks) of a process, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[19], int(fields[11]) + int(fields[12])


class Sampler:
    """Add up the CPU ticks each kind of process used since the sampler started."""

    def __init__(self) -> None:
        self.ticks: Counter[str] = Counter()
        self._seen: dict[tuple[str, str], tuple[str, int]] = {}
        self._stop = threading.Event()
        self._sample(count=False)  # what the processes running now used before the command started is not its
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Take a last sample and stop."""
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL):
            self._sample()

    def _sample(self, *, count: bool = True) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == str(os.getpid()):
                continue
            now = _ticks(pid)
            if now is None:
                continue
            started, ticks = now
            key = (pid, started)
            if key not in self._seen:
                kind = _kind(pid)
                if kind is None:
                    continue
                self._seen[key] = (kind, ticks if not count else 0)
            kind, before = self._seen[key]
            if ticks > before:
                self.ticks[kind] += ticks - before
                self._seen[key] = (kind, ticks)


def main() -> int:
    """Run the command after `--`, print its CPU by kind of process; exit with its exit code."""
    command = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else sys.argv[1:]
    if not command:
        print(__doc__)
        return 2
    sampler = Sampler()
    started = time.monotonic()
    code = subprocess.call(command)
    wall = time.monotonic() - started
    sampler.stop()
    total = sum(sampler.ticks.values()) / TICKS
    cores = os.cpu_count() or 1
    print(f"\n=== bench/suite_cpu.py: {' '.join(command)} ===")
    print(f"wall {wall:.0f} s; CPU {total:.0f} s on {cores} cores: {100 * total / (wall * cores):.0f} % busy")
    for kind, ticks in sampler.ticks.most_common():
        seconds = ticks / TICKS
        if seconds >= 1:
            print(f"  {seconds:8.1f} s  {100 * seconds / total:5.1f} %  {kind}")
    return code


if __name__ == "__main__":
    sys.exit(main())
