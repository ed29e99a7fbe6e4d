"""`python manage.py check_services [--create-db]`: say which backing service is unreachable and how to start it."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.database_url import configured_hosts
from core.redis_guard import sentinel_addresses

HOW_TO_START = {
    "PostgreSQL": "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
    "RabbitMQ": "rabbitmq-server -detached && rabbitmqctl await_startup",
    "Redis": "redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no",
}
COMPOSE_HINT = "or start all three with: docker compose -f docker/compose.deps.yml up -d"


def _reachable(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class Command(BaseCommand):
    """Check that PostgreSQL, RabbitMQ and Redis answer; optionally create the database if it is missing."""

    help = "Check the backing services and explain how to start any that is down."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--create-db", action="store_true", help="Create the configured database if missing.")

    def handle(self, *args: Any, **options: Any) -> None:
        db = settings.DATABASES["default"]
        brokers = [urlparse(url) for url in settings.CELERY_BROKER_URL.split(";") if url.strip()]
        cache = urlparse(settings.REDIS_URL)
        # Each service may be several nodes (a multi-host DATABASE_URL, a broker failover list, Sentinel): one
        # node that answers is enough to start.
        targets = {
            "PostgreSQL": (configured_hosts(db), "DATABASE_URL"),
            "RabbitMQ": ([(b.hostname or "127.0.0.1", b.port or 5672) for b in brokers], "CELERY_BROKER_URL"),
            "Redis": (
                sentinel_addresses() or [(cache.hostname or "127.0.0.1", cache.port or 6379)],
                "REDIS_SENTINELS" if settings.REDIS_SENTINELS else "REDIS_URL",
            ),
        }
        down = []
        for name, (nodes, variable) in targets.items():
            where = ", ".join(f"{host}:{port}" for host, port in nodes)
            if any(_reachable(host, port) for host, port in nodes):
                self.stdout.write(f"ok   {name} at {where}")
            else:
                down.append(name)
                self.stderr.write(
                    f"DOWN {name} is not reachable at {where} (set by {variable}).\n"
                    f"     Start it with: {HOW_TO_START[name]}\n     {COMPOSE_HINT}"
                )
        if down:
            raise CommandError(f"Not reachable: {', '.join(down)}. See above for how to start them.")
        if options["create_db"]:
            self._create_database(db)

    def _create_database(self, db: Mapping[str, Any]) -> None:
        import psycopg
        from psycopg import sql

        params = {"host": db["HOST"], "port": db["PORT"], "user": db["USER"], "password": db.get("PASSWORD") or None}
        # With several hosts, create it on the primary (the standbys follow it).
        params["target_session_attrs"] = db.get("OPTIONS", {}).get("target_session_attrs")
        with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=3, **params) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
                self.stdout.write(f"created database {db['NAME']}")
