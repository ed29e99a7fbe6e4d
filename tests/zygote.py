"""Start the tests' Celery workers by forking a warm interpreter instead of starting a cold one.

A Celery worker started as `python -m celery` spends about 1.5 s of CPU importing Celery, Django, DRF, psycopg,
botocore and the rest before it reads a setting, and the suite starts hundreds of them on a 2-core machine. The
zygote (one per pytest process, started on first use) imports those third-party modules once, with no Django
settings and no connection, and forks a child per worker. The child takes the worker's environment, argv and log
and runs `python -m celery` in-process, so it reads its settings, imports the project's own modules, connects and
exits exactly as a cold process does; only the third-party imports are inherited.

What the zygote imports it finds by asking: a throwaway child sets Django up and imports what a worker imports,
and reports the module names; the zygote imports the third-party ones among them that import without settings.
A start whose environment changes what a module reads when it is imported (`PYTHON*`, `PROMETHEUS_*`, `OTEL_*`)
or that runs another tree's code is started cold (tests/conftest.py decides; `NOTIFIER_TEST_ZYGOTE=0` turns the
zygote off altogether).

Protocol, over a Unix socket: one JSON line per start ({"argv", "env", "cwd", "log", "status"}), answered with
{"pid"}. The zygote reaps its children and writes each one's exit code (negative for a signal, as `Popen`) to
its `status` file, which `ForkedProcess` reads.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# What a Celery worker, beat, gunicorn or uvicorn imports besides its settings; the throwaway child imports these
# after django.setup().
WORKER_IMPORTS = (
    "config.celery",
    "celery.bin.celery",
    "celery.apps.worker",
    "celery.apps.beat",
    "django_celery_beat.schedulers",
    "celery.worker.consumer.consumer",
    "celery.concurrency.prefork",
    "kombu.transport.pyamqp",
    # The API's and the stream's servers: their own modules and what the views import (first-party ones are
    # only discovered through, never preloaded).
    "gunicorn.app.wsgiapp",
    "gunicorn.workers.gthread",
    "uvicorn.main",
    "config.urls",
    "config.asgi",
)
# Environment variables some third-party module reads when it is imported (prometheus_client's multiprocess
# mode, OpenTelemetry's context, the interpreter's own): a start that changes one is started cold.
IMPORT_TIME_ENV_PREFIXES = ("PYTHON", "PROMETHEUS_", "OTEL_")
_INHERITED_ENV_ALLOWED = {"PYTHONUNBUFFERED"}
# The running script under its two names (multiprocessing aliases it): never preloaded.
_MAIN_MODULES = {"__main__", "__mp_main__"}


def changes_import_time_env(overrides: dict[str, str]) -> bool:
    """Return whether these environment overrides change something a module reads at import time."""
    return any(
        name.startswith(IMPORT_TIME_ENV_PREFIXES)
        and name not in _INHERITED_ENV_ALLOWED
        and os.environ.get(name) != value
        for name, value in overrides.items()
    )


def _first_party(name: str) -> bool:
    """Return whether a module belongs to this repository (its top-level package is a directory or file here)."""
    top = name.partition(".")[0]
    return (ROOT / top).is_dir() or (ROOT / f"{top}.py").is_file()


def _worker_module_names(settings_module: str) -> list[str]:
    """Return, in import order, the modules a worker imports (found in a throwaway child with Django set up)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the throwaway child
        os.close(read_end)
        code = 0
        try:
            os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
            import django

            django.setup()
            for module in WORKER_IMPORTS:
                importlib.import_module(module)
            with os.fdopen(write_end, "w") as out:
                out.write("\n".join(sys.modules))
        except BaseException as error:  # reported on the zygote's log; the zygote then preloads nothing
            print(f"zygote: discovery failed: {error!r}", file=sys.stderr)
            code = 1
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        names = answer.read().split("\n")
    os.waitpid(pid, 0)
    return [name for name in names if name and name not in _MAIN_MODULES and not _first_party(name)]


def _preload(names: list[str]) -> tuple[int, list[str]]:
    """Import the modules that import without Django settings; return how many did and which did not."""
    loaded, refused = 0, []
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            loaded += 1
        except Exception:  # a module that needs settings is left to the child, as in a cold start
            refused.append(name)
    return loaded, refused


def _run_child(request: dict[str, Any]) -> None:
    """Become the requested process: its session, log, directory, environment and `python -m` argv."""
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    module, *args = request["argv"]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _serve(path: str, parent: int) -> dict[str, Any] | None:
    """Fork a child per request until the parent goes away; return the request in the child, None in the zygote."""
    statuses: dict[int, str] = {}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("zygote: ready", flush=True)
    while os.getppid() == parent:
        readable, _, _ = select.select([listener], [], [], 0.05)
        while statuses:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            status_path = statuses.pop(pid, None)
            if status_path:
                Path(f"{status_path}.tmp").write_text(str(os.waitstatus_to_exitcode(status)))
                os.replace(f"{status_path}.tmp", status_path)
        if not readable:
            continue
        connection, _ = listener.accept()
        with connection, connection.makefile("rwb") as stream:
            request = json.loads(stream.readline())
            pid = os.fork()
            if pid == 0:
                listener.close()
                return dict(request)
            statuses[pid] = request["status"]
            stream.write(json.dumps({"pid": pid}).encode() + b"\n")
            stream.flush()
    listener.close()
    return None


def main() -> None:
    """Preload the third-party modules, then serve starts on the socket named in argv."""
    path, settings_module = sys.argv[1], sys.argv[2]
    parent = os.getppid()
    started = time.process_time()
    os.environ.pop("DJANGO_SETTINGS_MODULE", None)
    loaded, refused = _preload(_worker_module_names(settings_module))
    from django.conf import settings

    # A child must read its own settings and start its own threads: refuse to serve otherwise (the caller then
    # starts cold).
    if (
        settings.configured
        or threading.active_count() != 1
        or any(_first_party(m) for m in sys.modules if m.partition(".")[0] != "tests")
    ):
        print("zygote: preloading configured Django, started a thread or imported the project; not serving", flush=True)
        return
    print(
        f"zygote: {loaded} modules preloaded in {time.process_time() - started:.2f} s of CPU,"
        f" {len(refused)} left to the children",
        flush=True,
    )
    request = _serve(path, parent)
    if request is not None:
        _run_child(request)


class ForkedProcess:
    """`Popen`'s process interface (pid, returncode, poll, wait, send_signal, terminate, kill) for a forked child."""

    def __init__(self, pid: int, status_path: Path) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._status_path = status_path

    def poll(self) -> int | None:
        """Return the exit code once the zygote has reaped the process, else None."""
        if self.returncode is None and self._status_path.exists():
            self.returncode = int(self._status_path.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to exit and return its code; raise TimeoutExpired as `Popen.wait` does."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.02)
        return code

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the process itself (not its group), unless it has exited, as `Popen.send_signal`."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        """Send SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """Send SIGKILL."""
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The client side: start the zygote process, then ask it for children."""

    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self._dir = run_dir
        self._dir.mkdir(parents=True, exist_ok=True)
        # Under the temporary directory, not the checkout: a Unix socket's path holds at most 107 bytes, and a CI
        # checkout's var/ can be deeper than that leaves room for.
        self._socket_dir = tempfile.mkdtemp(prefix="notifier-zygote-")
        self.socket_path = os.path.join(self._socket_dir, "sock")
        self.log_path = self._dir / "zygote.log"
        self._log = self.log_path.open("w")
        self._starts = itertools.count(1)
        settings_module = env.get("DJANGO_SETTINGS_MODULE", "config.settings")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote", self.socket_path, settings_module],
            cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def ready(self, timeout: float = 60) -> bool:
        """Wait until the zygote serves; return False if it stopped instead (the caller then starts cold)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "zygote: ready" in self.log_path.read_text():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> ForkedProcess:
        """Fork `python -m <argv>` with this environment, directory and log."""
        status = self._dir / f"exit-{next(self._starts)}"
        request = {"argv": argv, "env": env, "cwd": str(cwd), "log": str(log_path), "status": str(status)}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(self.socket_path)
            with connection.makefile("rwb") as stream:
                stream.write(json.dumps(request).encode() + b"\n")
                stream.flush()
                answer = json.loads(stream.readline())
        return ForkedProcess(int(answer["pid"]), status)

    def stop(self) -> None:
        """Stop the zygote (its children are the tests' to stop)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self._log.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
