"""Settings for replicated dependencies: a multi-host DATABASE_URL, a broker failover list, Redis through Sentinel.

The faults themselves run in tests/cluster/ against real clusters; these are the parts that need none: how the
settings are read, and what /readyz and /metrics say when one node of several is away.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from django.test import Client
from kombu import Queue

from config.celery import app as celery_app
from core import redis_guard, task_names
from core.broker_consumer import FailoverDelayedDelivery
from core.database_url import configured_hosts, parse_database_url
from core.queues import broker_recently_down
from notifier.deliveries import outbox
from tests.cluster.servers import RedisSentinelSet
from tests.conftest import BROKER_URL, NS, VHOST, purge_all_queues, queue_depth, wait_for
from tests.redis_server import free_port


def _readyz(settings: Any, broker_url: str) -> tuple[int, dict[str, Any]]:
    """Return /readyz's status and body with CELERY_BROKER_URL set to `broker_url` (1 s per probe)."""
    settings.CELERY_BROKER_URL = broker_url
    settings.READYZ_TIMEOUT_SECONDS = 1.0
    response = Client().get("/readyz")
    assert "guest" not in response.content.decode()  # an error is a class name, never a URL
    return response.status_code, response.json()


@pytest.mark.pure
def test_a_multi_host_database_url_gives_libpq_lists_and_keeps_its_options() -> None:
    """Two hosts and target_session_attrs: HOST and PORT as libpq's lists, the option passed to psycopg."""
    config = parse_database_url(
        "postgres://notifier:s%40cret@db-a:5433,db-b/notifier?target_session_attrs=read-write", conn_max_age=60
    )
    assert (config["HOST"], config["PORT"]) == ("db-a,db-b", "5433,5432")
    assert (config["USER"], config["PASSWORD"], config["NAME"]) == ("notifier", "s@cret", "notifier")
    assert config["OPTIONS"] == {"target_session_attrs": "read-write"}
    assert config["CONN_MAX_AGE"] == 60
    assert configured_hosts(config) == [("db-a", 5433), ("db-b", 5432)]


@pytest.mark.pure
def test_a_single_host_database_url_is_read_as_before() -> None:
    """One host: exactly what dj-database-url makes of it (an int port)."""
    config = parse_database_url("postgres://postgres@127.0.0.1:5432/notifier")
    assert (config["HOST"], config["PORT"], config["NAME"]) == ("127.0.0.1", 5432, "notifier")
    assert configured_hosts(config) == [("127.0.0.1", 5432)]


@pytest.mark.django_db
def test_readyz_with_one_broker_node_of_two_away_is_ready_and_degraded(settings: Any) -> None:
    """A failover list with a dead node: ready (200), the broker check counts 1 of 2 and names it degraded."""
    status, body = _readyz(settings, f"{BROKER_URL};amqp://guest:guest@127.0.0.1:{free_port()}//")
    assert status == 200, body
    assert body["checks"]["broker"] | {"latency_ms": 0} == {
        "ok": True, "latency_ms": 0, "nodes": 2, "nodes_up": 1, "degraded": True,
    }  # fmt: skip
    assert body["degraded"] == ["broker"]
    metrics = Client().get("/metrics").content.decode()
    assert 'notifier_dependency_nodes_up{dependency="broker"} 1.0' in metrics
    assert 'notifier_dependency_nodes{dependency="broker"} 2.0' in metrics
    assert "notifier_broker_up 1.0" in metrics  # the queue depths came from the node that answered


@pytest.mark.django_db
def test_readyz_with_every_broker_node_away_is_503(settings: Any) -> None:
    """No node of the list answers: not ready, and the error is a class name, never a URL."""
    status, body = _readyz(settings, ";".join(f"amqp://guest:guest@127.0.0.1:{free_port()}//" for _ in range(2)))
    assert status == 503
    assert body["checks"]["broker"]["ok"] is False


@pytest.fixture
def sentinels(tmp_path: Path, settings: Any) -> Iterator[RedisSentinelSet]:
    """A Redis master and replica under three Sentinels; this process's Redis client goes through them."""
    servers = RedisSentinelSet(tmp_path).start()
    settings.REDIS_SENTINELS = servers.sentinel_list.split(",")
    settings.REDIS_SENTINEL_MASTER = servers.MASTER_NAME
    redis_guard.get_redis.cache_clear()
    redis_guard.get_sentinel.cache_clear()
    try:
        yield servers
    finally:
        servers.stop()
        redis_guard.get_redis.cache_clear()
        redis_guard.get_sentinel.cache_clear()


@pytest.mark.django_db
def test_through_sentinel_the_client_writes_to_the_master_and_readyz_counts_the_replica(
    sentinels: RedisSentinelSet,
) -> None:
    """get_redis finds the master through the Sentinels (not REDIS_URL); /readyz counts master and replica."""
    redis_guard.get_redis().set(redis_guard.rkey("sentinel-probe"), "1")
    assert sentinels.master.client().get(redis_guard.rkey("sentinel-probe")) == "1"
    check = Client().get("/readyz").json()["checks"]["redis"]
    assert (check["ok"], check["nodes"], check["nodes_up"], check["degraded"]) == (True, 2, 2, False)

    sentinels.replica.kill()
    # The Sentinels mark a replica down after down-after-milliseconds (2 s here).
    deadline = time.monotonic() + 15
    while sentinels.known_replicas() and time.monotonic() < deadline:
        time.sleep(0.2)
    check = Client().get("/readyz").json()["checks"]["redis"]
    assert (check["ok"], check["nodes_up"], check["degraded"]) == (True, 1, True)


def test_a_worker_whose_first_broker_node_is_dead_sets_up_delayed_delivery_without_retrying_it(
    start_worker: Any,
) -> None:
    """A failover list starting at a dead node: delayed delivery is set up through the live one, no retry loop.

    Celery's own step retried the dead URL (1 s, 3 s, 5 s) before the consumer took a message, at every reconnect
    (core/broker_consumer.py); a countdown task still comes back through the delay exchanges to its queue.
    """
    dead = f"amqp://guest:guest@127.0.0.1:{free_port()}/{VHOST}"
    worker = start_worker(queues=["maintenance"], env={"CELERY_BROKER_URL": f"{dead};{BROKER_URL}"}, concurrency=1)
    celery_app.send_task(task_names.NOOP, queue="maintenance", countdown=1)
    wait_for(lambda: re.search(rf"{re.escape(task_names.NOOP)}\[[0-9a-f-]+\] succeeded", worker.log()), timeout=30)
    assert "Retrying delayed delivery setup" not in worker.log()
    assert "delayed delivery set-up failed" not in worker.log()


def test_a_worker_whose_control_queue_is_still_held_by_its_old_connection_waits_instead_of_exiting(
    start_worker: Any,
) -> None:
    """The worker's exclusive control queue is held by another connection when it connects: it retries, then consumes.

    What a worker meets when its broker node dies and it reconnects to another before the cluster has let go of the
    dead connection's queue (seen in tests/cluster): Celery answered RESOURCE_LOCKED with "Unrecoverable error" and
    the worker took nothing more. Here a connection of the test holds the queue until the worker has been refused.
    """
    name = f"test-{NS}-held-{time.monotonic_ns()}@{socket.gethostname()}"
    with celery_app.connection_for_write() as holder:
        held = Queue(f"{name}.celery.pidbox", exclusive=True, auto_delete=True, durable=False)
        held(holder.default_channel).declare()
        worker = start_worker(queues=["maintenance"], concurrency=1, wait=False, name=name)
        wait_for(lambda: "RESOURCE_LOCKED" in worker.log(), timeout=30)
        assert worker.proc.poll() is None, worker.log()[-2000:]
    celery_app.send_task(task_names.NOOP, queue="maintenance")
    wait_for(lambda: re.search(rf"{re.escape(task_names.NOOP)}\[[0-9a-f-]+\] succeeded", worker.log()), timeout=30)
    assert "Unrecoverable error" not in worker.log()


def _consumer_of(app: Celery) -> Any:
    """Return what the step reads of a Celery consumer: its app."""
    return SimpleNamespace(app=app)


def test_a_consumer_restart_declares_delayed_delivery_beside_consuming_not_before(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first start declares and waits; a restart (a reconnect) returns at once and declares on a thread.

    The restart's broker is a server of the test's own that accepts the connection and never answers: the step
    returns while its declaration still waits on it, then that declaration fails alone, with a warning.
    """
    step = FailoverDelayedDelivery(SimpleNamespace())
    step.start(_consumer_of(celery_app))  # the first start of this process: declared before returning
    assert "delayed delivery set-up failed" not in caplog.text
    with socket.create_server(("127.0.0.1", 0)) as server:
        silent = Celery(broker=f"amqp://guest:guest@127.0.0.1:{server.getsockname()[1]}//", set_as_current=False)
        silent.conf.broker_connection_timeout = 1
        step.start(_consumer_of(silent))
        setup = next(t for t in threading.enumerate() if t.name == "delayed-delivery-setup")
        accepted, _ = server.accept()  # the declaration is waiting on the silent server, the step has returned
        with accepted:
            setup.join(timeout=30)
    assert not setup.is_alive()
    assert "delayed delivery set-up failed, consuming anyway" in caplog.text


@pytest.mark.django_db
def test_a_publish_whose_connection_died_reconnects_and_is_not_left_to_the_relay() -> None:
    """The socket under the pooled producer is gone (its node died): the same publish reconnects and succeeds."""
    purge_all_queues()
    assert outbox.publish({"email.high": [1]}) == [1]
    with celery_app.producer_or_acquire() as producer:
        producer.connection.connection.transport.sock.shutdown(socket.SHUT_RDWR)
    assert outbox.publish({"email.high": [2]}) == [2]
    assert not broker_recently_down()  # nothing was given up: the relay's backoff was not started
    assert queue_depth("email.high") == 2
    purge_all_queues()
