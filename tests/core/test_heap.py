"""The start-up heap of the API's and the workers' processes is frozen out of the garbage collector (core/heap.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, test_database_url

PROGRAMS = {
    "the WSGI application (gunicorn's workers)": "import config.wsgi",
    "a Celery worker process": (
        "from config.celery import app; from celery.signals import worker_process_init;"
        " worker_process_init.send(sender=None)"
    ),
}


@pytest.mark.parametrize("program", list(PROGRAMS))
def test_a_loaded_process_keeps_its_start_up_heap_out_of_the_collector(program: str) -> None:
    code = f"import gc; before = gc.get_freeze_count(); {PROGRAMS[program]}; print(before, gc.get_freeze_count())"
    env = {**os.environ, "DATABASE_URL": test_database_url(), "DJANGO_SETTINGS_MODULE": "config.settings"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = map(int, out.stdout.split()[-2:])
    assert before == 0
    assert after > 50_000  # Django, DRF, Celery and the project's modules
