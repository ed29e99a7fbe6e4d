"""A silent PostgreSQL costs seconds, not a hang: the connection options of config/settings.py, on a server of the
test's own (its own port and directory, tests/cluster/servers.py) that the test pauses with SIGSTOP.

Never the machine's PostgreSQL: every fault here is injected on the server this module started.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import OperationalError, connections

from tests.cluster.servers import PgServer, missing_requirements
from tests.conftest import NS, ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _database_access(django_db_blocker: Any) -> Iterator[None]:
    """Let these tests open connections of their own (to their own server only, never the test database)."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture(scope="module")
def own_pg() -> Iterator[PgServer]:
    """A PostgreSQL server of this module's own, on a free loopback port."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix=f"notifier-pg-timeouts-{NS}-"))
    root.chmod(0o755)  # the postgres user keeps its data directory under it
    server = PgServer(root, "pg-silent")
    try:
        server.init().start()
        yield server
    finally:
        alias = f"silent-{server.port}"
        if alias in connections.settings:
            connections[alias].close()
            del connections[alias]
            del connections.settings[alias]
        server.resume()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _our_connection(server: PgServer) -> Any:
    """Return a Django connection with the settings' database options, aimed at `server`."""
    settings_dict = copy.deepcopy(settings.DATABASES["default"])
    settings_dict.update(HOST="127.0.0.1", PORT=str(server.port), NAME="postgres", USER="postgres", PASSWORD="")
    settings_dict["CONN_MAX_AGE"] = 0
    alias = f"silent-{server.port}"
    connections.settings[alias] = settings_dict  # receivers of connection_created look the alias up
    return connections[alias]


def test_the_connection_options_are_the_documented_ones(own_pg: PgServer) -> None:
    """Keepalives, the TCP user timeout and the connect timeout reach libpq on a real connection."""
    conn = _our_connection(own_pg)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
        dsn = dict(item.split("=", 1) for item in conn.connection.info.dsn.split())
    finally:
        conn.close()
    assert dsn["connect_timeout"] == "3"
    assert (dsn["keepalives"], dsn["keepalives_idle"], dsn["keepalives_interval"], dsn["keepalives_count"]) == (
        "1", "10", "3", "3",
    )  # fmt: skip
    assert dsn["tcp_user_timeout"] == "10000"


def test_a_query_to_a_paused_primary_fails_within_the_connect_timeout(own_pg: PgServer) -> None:
    """SIGSTOP: the kernel still completes the TCP handshake, nothing answers; the connect timeout ends it."""
    timeout = float(settings.DATABASES["default"]["OPTIONS"]["connect_timeout"])
    conn = _our_connection(own_pg)
    own_pg.pause()
    try:
        started = time.monotonic()
        with pytest.raises(OperationalError), conn.cursor() as cursor:
            cursor.execute("SELECT 1")
        elapsed = time.monotonic() - started
    finally:
        own_pg.resume()
        conn.close()
    print(f"\nquery to a paused server failed after {elapsed:.1f}s (connect_timeout {timeout:.0f}s)")
    # It waited for the server (not refused at once) and gave up at the timeout, not later.
    assert timeout - 0.5 <= elapsed <= timeout + 3, elapsed
    # The server answers again once resumed: the failure was the pause, not the server.
    conn = _our_connection(own_pg)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
    finally:
        conn.close()


def test_the_api_statement_timeout_cancels_a_long_statement(own_pg: PgServer) -> None:
    """DATABASE_STATEMENT_TIMEOUT_SECONDS (what gunicorn.conf.py sets for the API) from the environment."""
    script = (
        "import django, time; django.setup()\n"
        "from django.db import connection, OperationalError\n"
        "started = time.monotonic()\n"
        "try:\n"
        "    connection.cursor().execute('SELECT pg_sleep(20)')\n"
        "except OperationalError as exc:\n"
        "    print(type(exc.__cause__).__name__, round(time.monotonic() - started, 1))\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DEVELOPMENT": "true",
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{own_pg.port}/postgres",
        "DATABASE_STATEMENT_TIMEOUT_SECONDS": "1",
    }
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    kind, elapsed = result.stdout.split()
    assert kind == "QueryCanceled", result.stdout
    assert float(elapsed) < 10, elapsed


def test_gunicorn_gives_the_api_a_statement_timeout() -> None:
    """The API's gunicorn settings set 30 s unless the environment says otherwise; other processes keep none."""
    script = (
        "import runpy, os; runpy.run_path('gunicorn.conf.py'); print(os.environ['DATABASE_STATEMENT_TIMEOUT_SECONDS'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_STATEMENT_TIMEOUT_SECONDS"}
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.stdout.strip() == "30", result.stderr[-2000:]
    assert settings.DATABASE_STATEMENT_TIMEOUT_SECONDS == 0


def test_the_stream_listen_connection_has_the_timeouts_and_may_bypass_a_pooler(settings: Any) -> None:
    """The inbox stream's LISTEN connection: the same timeouts, and INBOX_LISTEN_DATABASE_URL when set."""
    from psycopg.conninfo import conninfo_to_dict

    from notifier.inbox.stream import _conninfo

    reads = conninfo_to_dict(_conninfo())
    listen = conninfo_to_dict(_conninfo(listen=True))
    for info in (reads, listen):
        assert (info["keepalives_idle"], info["tcp_user_timeout"], info["connect_timeout"]) == ("10", "10000", "3")
    assert listen["host"] == reads["host"]
    settings.INBOX_LISTEN_DATABASE_URL = (
        "postgres://notifier@db-a:5432,db-b:5433/notifier?target_session_attrs=read-write"
    )
    direct = conninfo_to_dict(_conninfo(listen=True))
    assert (direct["host"], direct["port"], direct["target_session_attrs"]) == ("db-a,db-b", "5432,5433", "read-write")
    assert direct["tcp_user_timeout"] == "10000"
    assert conninfo_to_dict(_conninfo())["host"] == reads["host"]  # the reads stay on DATABASE_URL (the pooler)


@pytest.mark.pure
def test_the_host_last_connected_to_goes_first_in_libpqs_lists() -> None:
    from core.postgresql.base import hosts_last_first

    assert hosts_last_first("a,b,c", "5432,5433,5434", ("b", "5433")) == ("b,a,c", "5433,5432,5434")
    assert hosts_last_first("a,b", "6432", ("b", "6432")) == ("b,a", "6432,6432")  # one port for all
    assert hosts_last_first("a,b", "", ("b", "5432")) == ("b,a", "")  # libpq's default port
    assert hosts_last_first("a,b", "5432,5433", ("b", "5432")) == ("a,b", "5432,5433")  # not one of the pairs
    assert hosts_last_first("a,b", "5432,5433", None) == ("a,b", "5432,5433")
    assert hosts_last_first("a,b,c", "1,2", ("b", "2")) == ("a,b,c", "1,2")  # libpq refuses it, not us


def test_after_a_silent_first_host_new_connections_go_straight_to_the_host_that_answered(own_pg: PgServer) -> None:
    """A host list whose first host is silent costs connect_timeout once per process, not on every connection.

    The silent host is a socket that listens and never answers: the kernel completes the TCP handshake, as for a
    primary whose host hangs, and libpq waits out connect_timeout before it tries the next host.
    """
    import socket

    from core.postgresql import base as backend

    timeout = float(settings.DATABASES["default"]["OPTIONS"]["connect_timeout"])
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    settings_dict = copy.deepcopy(settings.DATABASES["default"])
    settings_dict.update(
        HOST="127.0.0.1,127.0.0.1", PORT=f"{silent.getsockname()[1]},{own_pg.port}", NAME="postgres", USER="postgres"
    )
    settings_dict.update(PASSWORD="", CONN_MAX_AGE=0)
    settings_dict["OPTIONS"] = {**settings_dict["OPTIONS"], "target_session_attrs": "read-write"}
    alias = f"hosts-{own_pg.port}"
    connections.settings[alias] = settings_dict
    saved = dict(backend._last_host)
    backend._last_host.clear()
    took = []
    try:
        for _ in range(3):
            conn = connections[alias]
            started = time.monotonic()
            with conn.cursor() as cursor:
                cursor.execute("SELECT inet_server_port()")
                assert cursor.fetchone() == (own_pg.port,)
            took.append(time.monotonic() - started)
            conn.close()
    finally:
        backend._last_host.clear()
        backend._last_host.update(saved)
        connections[alias].close()
        del connections[alias]
        del connections.settings[alias]
        silent.close()
    print(f"\nconnections through a silent first host took {', '.join(f'{t:.2f}s' for t in took)}")
    assert took[0] >= timeout - 0.5  # the first waited out the silent host, as libpq does
    assert max(took[1:]) < timeout - 1  # the next ones went to the host that answered first
