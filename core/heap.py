"""Keep the objects a process loads at start out of the garbage collector's full collections.

Django, DRF, Celery and the project's modules leave a few hundred thousand long-lived objects behind at start.
Every full collection (triggered by the allocations of requests and tasks, a batch of 1,000 items allocates
tens of thousands of objects) walked all of them again, to free none. `gc.freeze()` moves what exists once the
process is loaded into a permanent generation the collector skips. In one paired in-process run
(`bench/accept_cpu.py`) a batch item took 201 µs of CPU against 235 and a single 3.12 ms against 3.49, a gain
within what the reference box's speed moves between runs. Nothing is leaked: cycles created afterwards are
collected as before; only the start-up heap, kept for the process's life anyway, is no longer scanned.
"""

from __future__ import annotations

import gc
from typing import Any


def freeze_loaded_heap(**_signal: Any) -> None:
    """Collect once, then move every object alive now out of the collector's reach (its permanent generation).

    Called when a process has loaded everything it will keep: after the WSGI application and its URLconf are
    built, in each Celery worker process once it is initialised, and by the inbox stream server at its first
    stream (notifier.inbox.stream, which also takes the full passes over from Python).
    """
    gc.collect()
    gc.freeze()
