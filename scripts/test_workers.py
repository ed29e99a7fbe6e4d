"""Print how many pytest-xdist workers `make test` starts: 4 where the broker has room for their vhosts, else 3.

The suite mostly waits on the processes its tests start (about half the CPU of a 2-core machine with three
workers), so a fourth worker shortens it; what bounds the count is RabbitMQ's file handles. A 3.x node accounts
handles for every quorum queue (about three each; a test vhost holds 64 queues, some 200 handles) out of a total
derived from its file limit (927 under the common limit of 1,024), and a node past it stops accepting
connections until vhosts are deleted. So a fourth worker is used only when the node's free handles, counting those
this namespace's worker vhosts already hold (a run reuses them), cover four workers' vhosts and their connections.

Where the node cannot be asked (no `rabbitmqctl` here, a broker elsewhere, no permission), the answer is 3.
`make test TEST_WORKERS=N` overrides it. docs/development.md, "Workers on a 2-core machine".

    python3 scripts/test_workers.py [--explain]   # the namespace from NOTIFIER_TEST_NS, else "main"
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

SAFE = 3
MORE = 4
HANDLES_PER_QUEUE = 3
HANDLES_PER_WORKER_VHOST = 200
# The connections the workers' tests hold at once (30 at the peak of a measured run), with room to spare.
HANDLES_FOR_CONNECTIONS = 60


def _ask(expression: str) -> str:
    """Return what the local node answers `rabbitmqctl eval` with, or raise."""
    node = os.environ.get("NOTIFIER_TEST_RABBITMQ_NODE", "")
    command = ["rabbitmqctl", *(["-n", node] if node else []), "-q", "eval", expression]
    return subprocess.run(command, capture_output=True, text=True, timeout=20, check=True).stdout


def workers(namespace: str) -> tuple[int, str]:
    """Return the worker count for `namespace` and why (see the module's docstring)."""
    try:
        info = _ask("file_handle_cache:info().")
        queues = _ask("[{V, length(rabbit_amqqueue:list(V))} || V <- rabbit_vhost:list_names()].")
    except (OSError, subprocess.SubprocessError) as exc:
        return SAFE, f"the broker's node could not be asked ({type(exc).__name__})"
    limit = re.search(r"total_limit,(\d+)", info)
    used = re.search(r"total_used,(\d+)", info)
    if limit is None or used is None:
        return SAFE, "the broker's node did not say its file handles"
    ours = re.compile(rf"notifier_test_{re.escape(namespace)}_gw\d+")
    held = sum(int(n) for vhost, n in re.findall(r'\{<<"([^"]+)">>,(\d+)\}', queues) if ours.fullmatch(vhost))
    free = int(limit.group(1)) - int(used.group(1)) + HANDLES_PER_QUEUE * held
    count = MORE if free >= MORE * HANDLES_PER_WORKER_VHOST + HANDLES_FOR_CONNECTIONS else SAFE
    why = f"{free} file handles free of {limit.group(1)} ({held} queues of this namespace's workers reused)"
    return count, why


if __name__ == "__main__":
    count, why = workers(os.environ.get("NOTIFIER_TEST_NS") or "main")
    print(f"{count}  # {why}" if "--explain" in sys.argv else count)
    sys.exit(0)
