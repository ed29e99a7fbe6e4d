"""The render zygote and children of templates_app.isolation: render templates under hard limits.

    python -m templates_app.render_worker --zygote FD     (started by the pool, never by hand)

The zygote sets Django up once and forks a child for each request on the control socket FD. A child limits
its address space (RLIMIT_AS), reads one JSON request per line on its socket ({"limits": ..., "items": [...]})
and writes one JSON answer per item ({"ok": {"parts", "locale"}} or {"error": {"message", "code", "path",
"variable"}}), raising at the time budget with SIGALRM. The budgets come with each request (the parent's
settings), so a changed setting applies without a restart.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from typing import Any, BinaryIO


def _address_space_bytes() -> int:
    """Return this process's current virtual size (VmSize), the base the memory limit is added to."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0  # pragma: no cover - Linux always reports VmSize


def _on_alarm(signum: int, frame: Any) -> None:
    from templates_app.budget import TemplateBudgetError, limits

    raise TemplateBudgetError(f"rendering took longer than {limits()['seconds']:g} s")


def _apply_limits(raw: dict[str, Any], applied: dict[str, Any]) -> None:
    """Make the parent's budgets this process's settings (they are read through budget.limits())."""
    from django.conf import settings

    from templates_app import budget

    if raw == applied:
        return
    names = {
        "part_chars": "TEMPLATE_MAX_PART_CHARS",
        "render_chars": "TEMPLATE_MAX_RENDER_CHARS",
        "iterations": "TEMPLATE_MAX_LOOP_ITERATIONS",
        "seconds": "TEMPLATE_MAX_RENDER_SECONDS",
        "width": "TEMPLATE_MAX_WIDTH",
    }
    for key, name in names.items():
        if key in raw:
            value = raw[key]
            setattr(settings, name, float(value) if key == "seconds" else int(value))
    budget.limits.cache_clear()
    applied.clear()
    applied.update(raw)


# The content last rendered per version id: the compile caches are keyed by version id, which is immutable in
# one database, but a test database reuses ids; a different content for a known id empties the caches.
_SEEN: dict[Any, Any] = {}


def _render_one(item: dict[str, Any], seconds: float) -> tuple[dict[str, Any], bool]:
    """Render one item; return its answer and whether this process must exit afterwards."""
    from templates_app import rendering
    from templates_app.models import Template, TemplateVersion

    pk = item["version_pk"]
    if (pk is not None and _SEEN.get(pk, item["content"]) != item["content"]) or len(_SEEN) > 8192:
        rendering.cache_clear()
        _SEEN.clear()
    if pk is not None:
        _SEEN[pk] = item["content"]

    template = Template(key="isolated", default_locale=item["default_locale"])
    version = TemplateVersion(pk=item["version_pk"], template=template, content=item["content"])
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        rendered = rendering.render_here(
            version, channel=item["channel"], locale=item["locale"], payload=item["payload"]
        )
        return {"ok": {"parts": rendered.parts, "locale": rendered.locale, "link_marker": rendered.link_marker}}, False
    except rendering.RenderError as exc:
        error = {"message": exc.message, "code": exc.code, "path": exc.path, "variable": exc.variable}
        return {"error": error}, False
    except MemoryError:
        message = "over the template budget: rendering needed more memory than allowed"
        return {"error": {"message": message, "code": "template_budget"}, "exit": True}, True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _serve(reader: BinaryIO, write: Callable[[bytes], Any]) -> None:
    """Answer requests (one JSON line each) with one JSON line per item, until the stream ends."""
    memory_mb = None
    applied: dict[str, Any] = {}
    for line in reader:
        request = json.loads(line)
        limits = request["limits"]
        if memory_mb is None:
            memory_mb = float(limits.get("memory_mb", 256))
            limit = _address_space_bytes() + int(memory_mb * 1024 * 1024)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        _apply_limits(limits, applied)
        for item in request["items"]:
            try:
                seconds = limits["seconds"] if item.get("seconds") is None else item["seconds"]
                answer, leave = _render_one(item, float(seconds))
                data = json.dumps(answer, separators=(",", ":"), default=str).encode()
            except MemoryError:
                error = {"message": "over the template budget: memory", "code": "template_budget"}
                answer, leave = {"error": error, "exit": True}, True
                data = json.dumps(answer).encode()
            write(data + b"\n")
            if leave:
                return


def _child(control: socket.socket, ours: socket.socket, theirs: socket.socket) -> None:
    """Run in a freshly forked child: serve the parent on `theirs`, then leave without the zygote's exit code."""
    try:
        control.close()
        ours.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _serve(theirs.makefile("rb"), theirs.sendall)
    except BaseException:  # the last words go to stderr; the parent sees the stream end
        traceback.print_exc(limit=3)
    finally:
        os._exit(0)


def zygote(control_fd: int) -> None:
    """Set Django up once, then fork a render child for every byte the parent sends on `control_fd`."""
    control = socket.socket(fileno=control_fd)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from templates_app import rendering

    rendering.ISOLATED = True
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    control.sendall(b"ready\n")
    while control.recv(1):
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            _child(control, ours, theirs)
        theirs.close()
        pidfd = os.pidfd_open(pid)
        socket.send_fds(control, [f"child {pid}\n".encode()], [ours.fileno(), pidfd])
        ours.close()
        os.close(pidfd)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--zygote":
        zygote(int(sys.argv[2]))
    else:
        sys.exit("started by templates_app.isolation, not by hand")
