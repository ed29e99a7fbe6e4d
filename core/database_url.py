"""DATABASE_URL to Django's database settings, with libpq's multi-host form for a primary and its standbys.

A managed PostgreSQL with a standby (or a self-run primary and hot standbys) is reached with one URL naming
every host, `postgres://user@db1:5432,db2:5432/notifier?target_session_attrs=read-write`: libpq tries the hosts
in order and keeps the first that accepts writes, so after a failover new connections find the promoted
standby without a configuration change. dj-database-url rejects such a netloc; this parses it, hands the rest
of the URL to dj-database-url, and gives Django HOST and PORT as libpq's comma-separated lists (psycopg passes
them through unchanged).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dj_database_url


def database_hosts(url: str) -> list[tuple[str, int]]:
    """Return the (host, port) pairs of a postgres:// URL, in libpq's order (5432 where a port is left out)."""
    netloc = urlsplit(url).netloc
    hosts = netloc.rpartition("@")[2]
    pairs = []
    for item in hosts.split(","):
        host, _, port = item.rpartition(":") if not item.endswith("]") else (item, "", "")
        if not host:  # no port given: the whole item is the host
            host, port = item, ""
        pairs.append((host.strip("[]") or "127.0.0.1", int(port or 5432)))
    return pairs


def parse_database_url(url: str, **kwargs: Any) -> dict[str, Any]:
    """Return Django's DATABASES entry for `url`; a multi-host URL gives comma-separated HOST and PORT."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return dict(dj_database_url.parse(url, **kwargs))
    pairs = database_hosts(url)
    first = f"{userinfo}@{hosts.split(',')[0]}" if userinfo else hosts.split(",")[0]
    config = dict(dj_database_url.parse(urlunsplit(parts._replace(netloc=first)), **kwargs))
    config["HOST"] = ",".join(host for host, _ in pairs)
    config["PORT"] = ",".join(str(port) for _, port in pairs)
    return config


def configured_hosts(db: dict[str, Any]) -> list[tuple[str, int]]:
    """Return the (host, port) pairs of a DATABASES entry (several for a multi-host DATABASE_URL)."""
    hosts = str(db.get("HOST") or "127.0.0.1").split(",")
    ports = str(db.get("PORT") or "").split(",")
    # libpq: one port for every host, or one per host.
    ports = ports * len(hosts) if len(ports) == 1 else ports
    return [(host, int(port or 5432)) for host, port in zip(hosts, ports, strict=True)]
