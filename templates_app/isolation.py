"""Render templates outside the bounded subset in child processes with a hard memory limit and a wall-clock kill.

A template that recurses without printing, or a single C-level operation that builds gigabytes, cannot be
stopped from inside the thread that runs it. Such templates (anything templates_app.bounded does not prove
bounded) are rendered in a small pool of child processes, reused across renders:

- a zygote (`python -m templates_app.render_worker --zygote FD`) sets Django up once and forks the children,
  so a replacement takes milliseconds, not the 1.5 s of a fresh interpreter;
- a child reads one JSON line per request on its socket and writes one JSON line per rendered item (JSON, not
  pickle: the parent never unpickles what a child running untrusted templates wrote);
- the child limits its own address space (RLIMIT_AS: its size at the first request plus
  TEMPLATE_RENDER_MEMORY_MB) and stops a render at the time budget with SIGALRM; a MemoryError answers
  `template_budget` and the child exits, to start clean;
- the parent waits for each item's answer at most the time budget plus TEMPLATE_RENDER_KILL_GRACE_SECONDS
  (for a C call the alarm cannot interrupt); past it, the child is killed through its pidfd, the item fails
  with `template_budget` and a replacement is forked in the background;
- a batch of items travels in one round trip and the answers stream back one per item, so one bad item
  fails alone: after a kill, the items after it go to another child.

The pool is per process (an API or Celery worker process) and lazily started: a process that never renders
such a template never starts a child. It is safe after fork (a forked process starts its own zygote).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from templates_app import budget

logger = logging.getLogger(__name__)

_ROOT = Path(__file__).resolve().parent.parent
_READY = b"ready\n"
# A child sets Django up before it answers; on a loaded machine that can take seconds, never minutes.
_START_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class IsolatedItem:
    """One rendering for a child: the version's content (JSON) and what to render it with."""

    version_pk: int | None
    default_locale: str
    content: dict[str, Any]
    channel: str
    locale: str
    payload: dict[str, Any]
    # What is left of the time budget when an in-process attempt already spent some (None: all of it).
    seconds: float | None = None


class ChildFailed(Exception):
    """The child died, hung or answered garbage (its item fails with template_budget), or none was free."""


def _settings_limits() -> dict[str, float]:
    return {**budget.limits(), "memory_mb": float(settings.TEMPLATE_RENDER_MEMORY_MB)}


class _Zygote:
    """A process with Django set up that forks render children on request (a fork takes milliseconds).

    Starting a fresh interpreter takes about 1.5 s (most of it Django's set-up); forking one that is already set
    up, and single-threaded, takes a few milliseconds, so a killed child is replaced before anyone waits for it.
    The zygote sends each child's socket and pidfd back over a Unix socket (SCM_RIGHTS); the pidfd lets this
    process kill exactly that child, with no risk of a recycled pid.
    """

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        # The zygote inherits this process's environment, so it reads the same settings.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "templates_app.render_worker", "--zygote", str(theirs.fileno())],
            cwd=_ROOT, stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()], close_fds=True,
        )  # fmt: skip
        theirs.close()
        self.sock = ours
        self.sock.settimeout(_START_SECONDS)
        try:
            ready = self.sock.recv(len(_READY))
        except OSError:
            ready = b""
        if ready != _READY:
            self.close()
            raise ChildFailed(f"template render zygote did not start: {ready[:200]!r}")

    def fork(self) -> _Child:
        """Ask for a new child; return it."""
        self.sock.sendall(b"f")
        message, fds, _, _ = socket.recv_fds(self.sock, 64, 2)
        if len(fds) != 2 or not message.startswith(b"child "):
            for fd in fds:
                os.close(fd)
            raise ChildFailed("the template render zygote did not fork")
        return _Child(int(message.split()[1]), socket.socket(fileno=fds[0]), fds[1])

    def alive(self) -> bool:
        """Return whether the zygote still runs."""
        return self.proc.poll() is None

    def close(self) -> None:
        """Stop the zygote (its children stop when their sockets close)."""
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)


class _Child:
    """One render child: its socket (requests in, answers out) and a pidfd to kill it by."""

    def __init__(self, pid: int, sock: socket.socket, pidfd: int) -> None:
        self.pid = pid
        self.sock = sock
        self.pidfd = pidfd
        self.gone = False
        self._buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        """Write one request line."""
        try:
            self.sock.sendall(json.dumps(message, separators=(",", ":"), default=str).encode() + b"\n")
        except OSError as exc:
            self.gone = True
            raise ChildFailed(f"render child gone: {exc}") from None

    def read_line(self, deadline: float, max_bytes: int = 64 * 1024 * 1024) -> bytes:
        """Return the next line the child writes, waiting at most until `deadline`."""
        fd = self.sock.fileno()
        poller = select.poll()  # not select(): a busy process may hold file descriptors above 1024
        poller.register(fd, select.POLLIN)
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChildFailed("render took longer than its budget: the renderer was stopped")
            if not poller.poll(max(int(left * 1000), 1)):
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self.gone = True
                raise ChildFailed("the renderer stopped (over its memory or time budget)")
            self._buffer += chunk
            if len(self._buffer) > max_bytes:
                raise ChildFailed("the renderer answered more than the output budget")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def alive(self) -> bool:
        """Return whether the child may still serve (no end of stream seen, never killed)."""
        return not self.gone

    def kill(self) -> None:
        """Stop the child now (the zygote reaps it) and close what points to it."""
        if not self.gone:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.gone = True
        self.sock.close()
        try:
            os.close(self.pidfd)
        except OSError:
            pass


class RenderPool:
    """A per-process pool of render children (see the module's docstring)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._zygote: _Zygote | None = None
        self._zygote_lock = threading.Lock()
        self._idle: queue.LifoQueue[_Child] = queue.LifoQueue()
        self._count = 0
        self.kills = 0  # children stopped (killed at the deadline, or gone on their own)
        self.renders = 0  # items sent to a child

    def _spawn(self) -> _Child:
        """Fork a new child from the zygote, starting the zygote first if it is not running."""
        with self._zygote_lock:
            if self._zygote is None or not self._zygote.alive():
                if self._zygote is not None:
                    self._zygote.close()
                self._zygote = _Zygote()
            try:
                return self._zygote.fork()
            except OSError as exc:
                self._zygote.close()
                self._zygote = None
                raise ChildFailed(f"the template render zygote failed: {exc}") from None

    def _size(self) -> int:
        return max(1, int(settings.TEMPLATE_RENDER_PROCESSES))

    def _acquire(self) -> _Child:
        if self._pid != os.getpid():
            self._reset()  # forked: the children belong to the parent process
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            spawn = self._count < self._size()
            if spawn:
                self._count += 1
        if spawn:
            try:
                return self._spawn()
            except Exception:
                with self._lock:
                    self._count -= 1
                raise
        wait = float(settings.TEMPLATE_RENDER_WAIT_SECONDS)
        try:
            return self._idle.get(timeout=wait)
        except queue.Empty:
            raise ChildFailed(f"every template renderer stayed busy for {wait:g} s") from None

    def _release(self, child: _Child) -> None:
        if child.alive():
            self._idle.put(child)
        else:
            self._retire(child)

    def _retire(self, child: _Child) -> None:
        """Kill a child and start its replacement in the background."""
        child.kill()
        pid = self._pid

        def replace() -> None:
            try:
                fresh = self._spawn()
            except Exception:
                logger.exception("could not start a template render child")
                with self._lock:
                    self._count -= 1
                return
            if pid == os.getpid() and pid == self._pid:
                self._idle.put(fresh)
            else:  # pragma: no cover - forked while replacing
                fresh.kill()

        threading.Thread(target=replace, name="template-render-replace", daemon=True).start()

    def render(self, items: Sequence[IsolatedItem]) -> list[dict[str, Any]]:
        """Render each item in a child; return one answer per item ({"ok": ...} or {"error": ...})."""
        answers: list[dict[str, Any]] = []
        limits = _settings_limits()
        grace = float(settings.TEMPLATE_RENDER_KILL_GRACE_SECONDS)
        pending = list(items)
        self.renders += len(pending)
        while pending:
            try:
                child = self._acquire()
            except ChildFailed as exc:
                # No child to render with (all busy, or none could start): the rest can be tried again later.
                logger.warning("template rendering refused: %s", exc)
                busy = {"error": {"message": f"template renderer unavailable: {exc}", "code": "renderer_busy"}}
                answers.extend(busy for _ in pending)
                break
            try:
                child.send({"limits": limits, "items": [_item_json(item) for item in pending]})
                while pending:
                    seconds = limits["seconds"] if pending[0].seconds is None else pending[0].seconds
                    deadline = time.monotonic() + seconds + grace
                    answer = json.loads(child.read_line(deadline))
                    if not isinstance(answer, dict) or not ({"ok", "error"} & answer.keys()):
                        raise ChildFailed("the renderer answered garbage")
                    answers.append(answer)
                    pending.pop(0)
                    if answer.get("exit"):  # the child ran out of memory and exits: the rest go to another
                        child.gone = True
                        break
            except (ChildFailed, ValueError) as exc:
                self.kills += 1
                self._retire(child)
                message = str(exc) if isinstance(exc, ChildFailed) else "the renderer answered garbage"
                answers.append({"error": {"message": message, "code": "template_budget"}})
                pending.pop(0)  # this item alone fails; the ones after it go to another child
                continue
            except BaseException:
                self._retire(child)  # interrupted mid-answer: the child's stream is out of step
                raise
            self._release(child)
        return answers

    def close(self) -> None:
        """Stop every idle child and the zygote (tests and benchmarks)."""
        while True:
            try:
                child = self._idle.get_nowait()
            except queue.Empty:
                break
            child.kill()
            with self._lock:
                self._count -= 1
        with self._zygote_lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None


def _item_json(item: IsolatedItem) -> dict[str, Any]:
    return {
        "version_pk": item.version_pk,
        "default_locale": item.default_locale,
        "content": item.content,
        "channel": item.channel,
        "locale": item.locale,
        "payload": item.payload,
        "seconds": item.seconds,
    }


POOL = RenderPool()
