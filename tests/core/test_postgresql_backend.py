"""The database backend's health check (core/postgresql/base.py): no round trip while the connection is quiet."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from tests.conftest import test_database_url, wait_for


def _last_statement(pid: int) -> str:
    """Return the last statement the session `pid` ran, as another session sees it."""
    with psycopg.connect(test_database_url(), autocommit=True) as other:
        row = other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return str(row[0]) if row else ""


@pytest.mark.django_db(transaction=True)
def test_a_quiet_connection_is_usable_without_asking_the_server() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'the last statement'")
    pid = connection.connection.info.backend_pid
    assert connection.is_usable()
    assert _last_statement(pid) == "SELECT 'the last statement'"  # no SELECT 1 ran


@pytest.mark.django_db(transaction=True)
def test_a_connection_the_server_closed_is_unusable_and_the_next_request_gets_a_new_one() -> None:
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with psycopg.connect(test_database_url(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    wait_for(lambda: not _last_statement(pid), timeout=10, interval=0.05)  # the session is gone

    assert not connection.is_usable()
    connection.close_if_unusable_or_obsolete()  # what Django runs as a request starts
    connection.close_if_health_check_failed()  # and before its first statement
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != pid
