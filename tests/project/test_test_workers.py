"""How many pytest workers `make test` starts (scripts/test_workers.py): a fourth only where the broker has room.

The script asks the broker's node through `rabbitmqctl`. The arithmetic is checked with a stand-in `rabbitmqctl`
first on PATH, printing what a RabbitMQ 3.10 node printed in each situation; the real node's answers are checked
to parse (a format the script did not read would fall back to 3 without saying why).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "test_workers.py"
FRESH = "[{total_limit,927},{total_used,0},{sockets_limit,832},{sockets_used,0}]"


def _run(tmp_path: Path, info: str | None, queues: str = "[]", namespace: str = "ci") -> str:
    """Run the script with a stand-in rabbitmqctl answering `info` and `queues` (None: the command is missing)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if info is not None:
        stand_in = bin_dir / "rabbitmqctl"
        stand_in.write_text(
            f"#!/bin/sh\ncase \"$*\" in *file_handle_cache*) echo '{info}' ;; *) echo '{queues}' ;; esac\n"
        )
        stand_in.chmod(0o755)
    env = {**os.environ, "PATH": str(bin_dir), "NOTIFIER_TEST_NS": namespace}
    env.pop("NOTIFIER_TEST_RABBITMQ_NODE", None)
    result = subprocess.run([sys.executable, str(SCRIPT), "--explain"], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.pure
def test_a_fresh_broker_gets_four_workers(tmp_path: Path) -> None:
    """Nothing on the node: 927 handles free, enough for four vhosts of some 200 and their connections."""
    assert _run(tmp_path, FRESH).startswith("4  # 927 file handles free of 927")


@pytest.mark.pure
def test_another_vhosts_queues_leave_three(tmp_path: Path) -> None:
    """Another vhost's 64 quorum queues hold 193 handles (make run's, a benchmark's): a fourth would not fit."""
    info = "[{total_limit,927},{total_used,193},{sockets_limit,832},{sockets_used,0}]"
    queues = '[{<<"/">>,64},{<<"notifier_test_ci">>,0}]'
    assert _run(tmp_path, info, queues).startswith("3  # 734 file handles free")


@pytest.mark.pure
def test_this_namespaces_own_worker_vhosts_are_counted_as_reusable(tmp_path: Path) -> None:
    """The run before left its four worker vhosts: the next run reuses them, so it still gets four."""
    info = "[{total_limit,927},{total_used,776},{sockets_limit,832},{sockets_used,0}]"
    queues = "[" + ",".join(f'{{<<"notifier_test_ci_gw{i}">>,64}}' for i in range(4)) + ',{<<"/">>,0}]'
    assert _run(tmp_path, info, queues).startswith("4  # 919 file handles free of 927 (256 queues")
    # Another namespace's vhosts of the same names but for "ci2" are not ours.
    assert _run(tmp_path, info, queues, namespace="ci2").startswith("3  # 151 file handles free")


@pytest.mark.pure
def test_without_rabbitmqctl_or_an_answer_it_is_three(tmp_path: Path) -> None:
    """No rabbitmqctl (a broker elsewhere), or an answer it cannot read: the safe count, with the reason."""
    assert _run(tmp_path, None) == "3  # the broker's node could not be asked (FileNotFoundError)"
    assert _run(tmp_path, "Error: unable to perform an operation on node") == (
        "3  # the broker's node did not say its file handles"
    )


@pytest.mark.skipif(shutil.which("rabbitmqctl") is None, reason="no rabbitmqctl on this machine")
def test_the_real_nodes_answers_are_read() -> None:
    """The machine's node answers in the format the script reads: a count with the handles it found."""
    result = subprocess.run([sys.executable, str(SCRIPT), "--explain"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    count, _, why = result.stdout.strip().partition("  # ")
    assert count in {"3", "4"}
    assert "file handles free of" in why, why
