"""`make run` survives its own ports: Flower's port comes from FLOWER_PORT and Flower failing stops nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BROKER_URL

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = [sys.executable, str(ROOT / "scripts" / "optional.py")]


def _procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line.strip() and not line.startswith("#"))


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else is already listening on."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


class _Output:
    """Collect a process's output lines in a background thread, so the test can wait for a line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._proc = proc
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self._proc.stdout:
            self.lines.append(line)

    def wait_for(self, needle: str, timeout: float, start: int = 0) -> int:
        """Return the index of the first line from `start` that contains `needle`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(start, len(self.lines)):
                if needle in self.lines[i]:
                    return i
            if self._proc.poll() is not None and time.monotonic() > deadline - timeout + 1:
                break
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} not seen in {timeout} s; output:\n{''.join(self.lines)}")


def test_procfile_flower_is_optional_and_takes_its_port_from_the_environment() -> None:
    """The Procfile wraps Flower in scripts/optional.py and passes --port=${FLOWER_PORT:-5555}."""
    flower = _procfile()["flower"]
    assert "scripts/optional.py flower --" in flower
    assert "--port=${FLOWER_PORT:-5555}" in flower
    assert "FLOWER_PORT=$(FLOWER_PORT)" in (ROOT / "Makefile").read_text()


def test_a_failing_optional_process_is_logged_and_waits_for_the_stop_signal() -> None:
    """The wrapper outlives its failed command, says so once, and exits 0 on SIGTERM."""
    proc = subprocess.Popen(
        [*OPTIONAL, "demo", "--", sys.executable, "-c", "raise SystemExit(3)"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)
        assert proc.poll() is None, "the wrapper exited with its command"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert "optional process 'demo' exited with code 3" in err


def test_the_wrapper_forwards_sigterm_to_a_running_command(tmp_path: Path) -> None:
    """A running optional command receives the stop signal (Flower shuts down cleanly)."""
    marker = tmp_path / "got-sigterm"
    script = (
        "import signal, sys, time, pathlib\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(marker)!r}).touch(), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([*OPTIONAL, "demo", "--", sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
    assert marker.exists()


@pytest.mark.slow
def test_honcho_keeps_the_stack_running_when_flowers_port_is_taken(tmp_path: Path, taken_port: int) -> None:
    """The real Procfile's flower line under honcho, its port taken: Flower fails, the other process lives on."""
    procfile = tmp_path / "Procfile"
    ticker = tmp_path / "ticker.py"
    ticker.write_text("import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.3)\n")
    procfile.write_text(f"web: {sys.executable} {ticker}\nflower: {_procfile()['flower']}\n")
    env = {**os.environ, "FLOWER_PORT": str(taken_port), "CELERY_BROKER_URL": BROKER_URL}
    proc = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "honcho"), "start", "-f", str(procfile), "-d", str(ROOT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    output = _Output(proc)
    try:
        failed = output.wait_for("optional process 'flower' exited with code", timeout=60)
        output.wait_for("tick", timeout=5, start=failed + 1)
        time.sleep(1.5)
        assert proc.poll() is None, "honcho stopped the stack when Flower failed"
        assert sum("tick" in line for line in output.lines[failed + 1 :]) >= 3
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _make_run(*overrides: str) -> str:
    """Return the commands `make run` would run (make -n: printed, not run), with make variables overridden."""
    variables = {"DEBUG", "FLOWER", "CELERY_TASK_LOGS", "DELIVERY_SENT_LOGS", "REQUEST_SUCCESS_LOG_SECONDS"}
    variables.add("STREAM_WORKERS")
    env = {k: v for k, v in os.environ.items() if k not in variables}
    out = subprocess.run(
        ["make", "-n", "run", *overrides], cwd=ROOT, capture_output=True, text=True, check=True, env=env
    ).stdout
    return out.replace("\\\n", " ")


def _honcho_line(out: str) -> str:
    return next(line for line in out.splitlines() if "honcho start" in line)


def test_make_run_ships_the_fast_configuration_and_says_so() -> None:
    """DEBUG off, Celery's per-task lines off, no Flower: and the start says what is on and how to turn it on."""
    out = _make_run()
    line = _honcho_line(out)
    assert "DEVELOPMENT=true" in line and "DEBUG=false" in line and "CELERY_TASK_LOGS=false" in line
    assert "DELIVERY_SENT_LOGS=false" in line.split()
    assert "REQUEST_SUCCESS_LOG_SECONDS=1" in line.split()
    assert "STREAM_WORKERS=2" in line.split()  # the stream server's processes (the Procfile's default is 1)
    started = line.split("-p 8000", 1)[1].split()
    # Every process of the Procfile but Flower, each once.
    assert sorted(started) == sorted(set(_procfile()) - {"flower"})
    assert "DEBUG=false (make run DEBUG=true" in out and "Flower and task events off (FLOWER=1)" in out
    assert "a line per delivery sent off (DELIVERY_SENT_LOGS=true)" in out
    assert "access lines of requests that succeeded at most one per 1 s (REQUEST_SUCCESS_LOG_SECONDS=0 for each)" in out


def test_make_run_turns_on_what_is_asked_for() -> None:
    line = _honcho_line(_make_run("FLOWER=1", "DEBUG=true", "CELERY_TASK_LOGS=true", "DELIVERY_SENT_LOGS=true"))
    assert line.split()[-1] == "flower"
    assert "DEBUG=true" in line and "CELERY_TASK_LOGS=true" in line and "DELIVERY_SENT_LOGS=true" in line.split()
    assert "STREAM_WORKERS=1" in _honcho_line(_make_run("STREAM_WORKERS=1")).split()
    each = _make_run("REQUEST_SUCCESS_LOG_SECONDS=0")
    assert "REQUEST_SUCCESS_LOG_SECONDS=0" in _honcho_line(each).split()
    assert "access lines of requests that succeeded each," in each


def test_celery_task_lines_are_off_unless_asked_for() -> None:
    """The loggers of Celery's "received" and "succeeded" lines sit at WARNING unless CELERY_TASK_LOGS=true."""
    script = (
        "import logging, django; django.setup(); "
        "names = ('celery.app.trace', 'celery.worker.strategy'); "
        "print([logging.getLogger(n).isEnabledFor(logging.INFO) for n in names])"
    )
    for value, expected in (("false", "[False, False]"), ("true", "[True, True]")):
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "CELERY_TASK_LOGS": value,
               "LOG_LEVEL": "WARNING", "DEVELOPMENT": "true"}  # fmt: skip
        out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, env=env)
        assert out.stdout.strip() == expected, out.stderr[-2000:]
