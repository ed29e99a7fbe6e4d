"""The tests' Celery workers are forked from a warm interpreter and still behave as cold ones (tests/zygote.py)."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import psutil
import pytest

from tests.conftest import _zygote
from tests.zygote import changes_import_time_env


@pytest.mark.pure
def test_a_start_that_changes_what_a_module_reads_at_import_is_started_cold() -> None:
    assert changes_import_time_env({"PROMETHEUS_MULTIPROC_DIR": "/tmp/metrics"})
    assert changes_import_time_env({"PYTHONPATH": "/elsewhere"})
    assert changes_import_time_env({"OTEL_PYTHON_CONTEXT": "contextvars_context"})
    assert not changes_import_time_env({"PYTHONUNBUFFERED": "1", "LOG_FORMAT": "json", "DATABASE_URL": "x"})


@pytest.mark.django_db(transaction=True)
def test_a_forked_worker_reads_its_own_environment_and_exits_as_a_process_does(start_worker: Any) -> None:
    # Two workers, two environments: each logs in the format its own environment asks for.
    json_worker = start_worker(queues=["maintenance"], env={"LOG_FORMAT": "json"}, concurrency=1)
    text_worker = start_worker(queues=["maintenance"], env={"LOG_FORMAT": "console"}, concurrency=1)
    if os.environ.get("NOTIFIER_TEST_ZYGOTE") == "0":
        pytest.skip("the zygote is turned off (NOTIFIER_TEST_ZYGOTE=0)")
    zygote = _zygote()
    assert zygote is not None, "the zygote did not start or refused to serve (var/zygote-*/zygote.log says why)"
    for worker in (json_worker, text_worker):
        assert psutil.Process(worker.proc.pid).ppid() == zygote.proc.pid
    json_lines = [line for line in json_worker.log().splitlines() if line.startswith("{")]
    assert json_lines and all(json.loads(line)["event"] for line in json_lines)
    assert not any(line.startswith("{") for line in text_worker.log().splitlines())
    # Killed, it reports the signal as Popen does (the suite's kill tests read it); signalled as Popen is.
    json_worker.kill(signal.SIGKILL)
    assert json_worker.proc.wait(timeout=10) == -signal.SIGKILL
    json_worker.proc.send_signal(signal.SIGTERM)  # exited: nothing to signal, as with Popen
    # Stopped warmly, Celery's own exit code.
    text_worker.stop()
    assert text_worker.proc.returncode == 0
