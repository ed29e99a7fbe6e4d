"""Health and readiness endpoints, against the real PostgreSQL, RabbitMQ and Redis."""

from __future__ import annotations

import socket

import pytest
from django.test import Client
from pytest_django import Settings


def _closed_loopback_port() -> int:
    """Return a loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.pure
def test_healthz_needs_no_dependency_and_no_key() -> None:
    """Liveness answers 200 without an API key and without touching the database."""
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_reports_every_dependency_up() -> None:
    """With database, broker and Redis reachable, readiness is 200 with one entry per dependency."""
    response = Client().get("/readyz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok"
    assert set(body["checks"]) == {"database", "broker", "redis"}
    assert all(check["ok"] for check in body["checks"].values())


@pytest.mark.django_db
def test_readyz_is_503_when_the_broker_is_unreachable(settings: Settings) -> None:
    """A broker on a closed port makes readiness 503, names the broker, and leaves the others up."""
    settings.CELERY_BROKER_URL = f"amqp://guest:guest@127.0.0.1:{_closed_loopback_port()}//"
    settings.READYZ_TIMEOUT_SECONDS = 1.0
    response = Client().get("/readyz")
    body = response.json()
    assert response.status_code == 503
    assert body["status"] == "unavailable"
    assert body["checks"]["broker"]["ok"] is False
    assert body["checks"]["broker"]["error"]
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["redis"]["ok"] is True
    # The detail never echoes the broker URL (it would carry credentials).
    assert "guest" not in response.content.decode()


@pytest.mark.pure
def test_ops_endpoints_refuse_writes() -> None:
    """The probes are read-only."""
    assert Client().post("/healthz").status_code == 405
