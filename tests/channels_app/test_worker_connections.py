"""Workers keep their database connection across tasks (config/celery.py, core.db.close_old_task_connections)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from config.celery import app as celery_app
from tests.conftest import wait_for

TASKS = 20


def _sessions() -> int:
    """Return how many sessions PostgreSQL has opened on the test database so far."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_many_database_tasks_on_one_connection(start_worker: Any) -> None:
    """Celery's Django fix-up closed every connection around every task: 20 relay runs were 20 new backends."""
    worker = start_worker(queues=["maintenance"], concurrency=1, pool="threads")
    before = _sessions()
    for _ in range(TASKS):
        celery_app.send_task("notifier.tasks.outbox_relay", queue="maintenance")
    wait_for(lambda: worker.log_path.read_text().count("notifier.tasks.outbox_relay[") >= 2 * TASKS)
    wait_for(lambda: worker.log_path.read_text().count("succeeded") >= TASKS)
    # One thread: its connection (and the process's pool-less helpers, a few at most), not one per task.
    assert _sessions() - before <= 3, _sessions() - before
