"""Django's PostgreSQL backend whose health check costs no round trip while the connection is quiet.

With CONN_HEALTH_CHECKS Django runs `SELECT 1` on a persistent connection before a request first uses it: a
round trip per request (about a tenth of the group writer's wall time under load, in a py-spy profile). Here
the check first looks at the socket, without blocking: between statements the server sends nothing unasked,
so a socket with nothing to read and a connection psycopg has not seen break is as usable as after its last
statement. A socket with something to read (the server closed it, as when PostgreSQL restarts or a failover
kills its sessions, or sent a notice) gets Django's `SELECT 1` as before, which closes a dead connection so
the request opens a new one. What neither check catches is the same as before: a host gone silent without
closing its sockets hangs `SELECT 1` as it hangs the request's first statement.

With several hosts (libpq's list: a primary and its standbys), a new connection tries first the host this
process last connected to, then the rest in the configured order. libpq would try them in the configured order
each time: after a failover whose old primary went silent, every new connection would wait out
`connect_timeout` on it before reaching the promoted standby.
"""

from __future__ import annotations

import select
from typing import Any

from django.db.backends.postgresql import base
from psycopg import pq

# The (host, port) this process last connected to, per host list of the settings that names several.
_last_host: dict[str, tuple[str, str]] = {}


def hosts_last_first(hosts: str, ports: str, last: tuple[str, str] | None) -> tuple[str, str]:
    """Return libpq's host and port lists with `last` moved to the front (unchanged if it is not among them).

    `ports` is one port for every host, one per host, or empty (libpq's forms).
    """
    names = hosts.split(",")
    numbers = ports.split(",") if ports else [""] * len(names)
    if len(numbers) == 1:
        numbers = numbers * len(names)
    if len(numbers) != len(names):
        return hosts, ports  # not a form libpq takes: let it say so
    pairs = list(zip(names, numbers, strict=True))
    # A host listed without a port is on libpq's default, whatever number the connection reports.
    found = [pair for pair in pairs if last is not None and pair[0] == last[0] and pair[1] in ("", last[1])]
    if not found:
        return hosts, ports
    ordered = [found[0], *(pair for pair in pairs if pair != found[0])]
    return ",".join(host for host, _ in ordered), ",".join(port for _, port in ordered) if ports else ""


class DatabaseWrapper(base.DatabaseWrapper):
    """The PostgreSQL backend with the quiet-socket health check and the last good host tried first."""

    def get_connection_params(self) -> dict[str, Any]:
        """Return Django's connection parameters, the host list starting with the host last connected to."""
        params: dict[str, Any] = super().get_connection_params()
        last = _last_host.get(str(self.settings_dict["HOST"]))
        if last is not None:
            params["host"], params["port"] = hosts_last_first(
                str(params.get("host") or ""), str(params.get("port") or ""), last
            )
        return params

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        """Connect as Django does; remember which host of a list accepted (libpq's choice)."""
        connection = super().get_new_connection(conn_params)
        hosts = str(self.settings_dict["HOST"])
        if "," in hosts:
            _last_host[hosts] = (str(connection.info.host), str(connection.info.port))
        return connection

    def is_usable(self) -> bool:
        """Return whether the connection can run a statement; ask the server only if the socket has news."""
        connection = self.connection
        if connection is None or connection.closed or connection.broken:
            return False
        try:
            readable, _, _ = select.select([connection.fileno()], [], [], 0)
        except (OSError, ValueError):
            return False
        if not readable and connection.info.transaction_status == pq.TransactionStatus.IDLE:
            return True
        return bool(super().is_usable())
