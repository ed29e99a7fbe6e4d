"""Run an optional process under honcho without letting its exit stop the rest of `make run`.

honcho ends every process when one exits. Flower is a convenience: when its port is taken or it crashes,
the API and the workers must keep running. This wrapper runs the command, forwards SIGINT/SIGTERM to it,
and when it exits on its own logs one line saying so and then waits quietly until honcho stops everything.

    python scripts/optional.py NAME -- COMMAND [ARG ...]
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from types import FrameType


def main(argv: list[str]) -> int:
    """Run the command after `--`; return 0 when stopped by a signal, whatever the command did."""
    if "--" not in argv or argv.index("--") != 1 or len(argv) < 3:
        print("usage: optional.py NAME -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    name, command = argv[0], argv[2:]
    stopping = threading.Event()
    child: subprocess.Popen[bytes] | None = None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.set()
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"optional process {name!r} could not start ({exc}); the rest keeps running", file=sys.stderr)
    else:
        code = child.wait()
        if stopping.is_set():
            return 0
        print(
            f"optional process {name!r} exited with code {code}; the rest keeps running without it",
            file=sys.stderr,
            flush=True,
        )
    # Stay out of the way until honcho (or the operator) stops the stack.
    stopping.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
