"""The RabbitMQ topology: exchanges, queues, worker classes and their declaration.

Queues are the contract between the API and the workers (and between hosts): one durable quorum queue per
channel and priority on one topic exchange, dead letters routed to `dead.<channel>`. The Celery app
(config/celery.py) declares these as its `task_queues`; apps reach the app through `celery.current_app`.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from typing import Any

from celery import Task, current_app
from celery.signals import worker_init
from django.db import InterfaceError, OperationalError
from kombu import Exchange, Queue
from kombu.transport.native_delayed_delivery import (
    bind_queue_to_native_delayed_delivery_exchange,
    declare_native_delayed_delivery_exchanges_and_queues,
)

from core.chat import CHAT_CHANNELS
from core.env import env

CHANNELS = ("push", "email", "sms", "inapp", "webhook", *CHAT_CHANNELS)
PRIORITY_QUEUES = ("high", "low")
EXCHANGE = Exchange("notifier", type="topic", durable=True)
DEAD_LETTER_EXCHANGE = Exchange("notifier.dlx", type="topic", durable=True)
# A message redelivered this many times (its worker keeps dying on it) is dead-lettered by RabbitMQ
# itself instead of looping forever: the quorum-queue poison-message guard.
DELIVERY_LIMIT = env.int("QUEUE_DELIVERY_LIMIT", 20)


@dataclass(frozen=True)
class WorkerClass:
    """One pool of Celery workers: the queues it consumes and how it runs them.

    The one source of truth for worker classes: the Procfile, docker/compose.yml and the Kubernetes manifests
    under deploy/ start exactly these (tests/project/test_deploy_files.py compares them). Priorities are separate
    classes because a worker started with `-Q a,b` does not prefer `a`.
    """

    name: str
    queues: tuple[str, ...]
    pool: str
    concurrency: int


# Provider calls are I/O-bound: the high pool runs threads so one process holds many sends in flight.
# Fan-out and the low pool stay prefork (CPU in rendering and bulk row writes). Maintenance gets its own
# single process so the outbox relay (the loss-prevention path) never waits behind fan-out or retention.
WORKER_CLASSES: tuple[WorkerClass, ...] = (
    WorkerClass("high", tuple(f"{channel}.high" for channel in CHANNELS), "threads", 8),
    WorkerClass("low", tuple(f"{channel}.low" for channel in CHANNELS), "prefork", 2),
    WorkerClass("fanout", ("fanout",), "prefork", 2),
    WorkerClass("maintenance", ("maintenance",), "prefork", 1),
    WorkerClass("events", ("events",), "threads", 8),
)


def queue_name(channel: str, priority: str) -> str:
    """Return the queue that carries `channel` sends of `priority` ("normal" travels on the low queue)."""
    return f"{channel}.{'high' if priority == 'high' else 'low'}"


def _work_queue(name: str, dead_routing_key: str) -> Queue:
    return Queue(
        name,
        EXCHANGE,
        routing_key=name,
        durable=True,
        queue_arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE.name,
            "x-dead-letter-routing-key": dead_routing_key,
            "x-delivery-limit": DELIVERY_LIMIT,
        },
    )


def build_queues() -> list[Queue]:
    """Return every queue of the topology; the API and every worker declare the same list."""
    queues = [
        _work_queue(queue_name(channel, priority), f"dead.{channel}")
        for channel in CHANNELS
        for priority in PRIORITY_QUEUES
    ]
    queues += [_work_queue("fanout", "dead.fanout"), _work_queue("maintenance", "dead.maintenance")]
    # Status events to calling services travel on their own queue and workers: never behind the sends.
    queues += [_work_queue("events", "dead.events")]
    # Dead-letter queues hold what exhausted its attempts; the database keeps the operator's record
    # (notifier.DeadLetter), the queue is for alerting on depth. Bounded so it can never fill the disk.
    queues += [
        Queue(
            f"dead.{name}",
            DEAD_LETTER_EXCHANGE,
            routing_key=f"dead.{name}",
            durable=True,
            queue_arguments={"x-queue-type": "quorum", "x-max-length": 1_000_000},
        )
        for name in (*CHANNELS, "fanout", "maintenance", "events")
    ]
    return queues


# After a failed publish the API stops trying for a few seconds: while the broker is down every request would
# otherwise wait for a connection timeout. The relay publishes what was skipped.
_broker_down_until = 0.0
_broker_lock = threading.Lock()
BROKER_BACKOFF_SECONDS = 5.0


def broker_recently_down() -> bool:
    """Return True if a publish from this process failed in the last few seconds."""
    return time.monotonic() < _broker_down_until


def mark_broker_down() -> None:
    """Note that a publish from this process just failed (publishers skip the broker for a few seconds)."""
    global _broker_down_until
    with _broker_lock:
        _broker_down_until = time.monotonic() + BROKER_BACKOFF_SECONDS


_topology_declared = False


def own_queue(routing_key: str) -> str | None:
    """Return the queue a message came from, also when it came back through native delayed delivery.

    A delayed message's routing key is its delay in bits before the queue's own ("0.0.….1.webhook.high").
    """
    for name in _queue_names():
        if routing_key == name or routing_key.endswith(f".{name}"):
            return name
    return None


@functools.cache
def _queue_names() -> tuple[str, ...]:
    # Building the topology's kombu entities for each retry's routing was 6 % of a send worker's CPU.
    return tuple(queue.name for queue in build_queues())


class OwnQueueTask(Task[Any, Any]):
    """A task whose retries go back to the queue its message came from.

    Celery routes a retry by the exchange and routing key of the message being retried. A retry with a
    countdown goes through native delayed delivery, and the message it comes back as carries the delay
    exchange and a delay-prefixed routing key: retried again from there, it is routed to a delay level no
    queue is bound to, and lost. Naming the queue routes every retry like a first publish.
    """

    def retry(self, *args: object, **options: object) -> object:  # type: ignore[override]
        """Retry as Celery does, on the queue this message came from unless one is named."""
        if not options.get("queue"):
            queue = own_queue(str((self.request.delivery_info or {}).get("routing_key") or ""))
            if queue:
                options["queue"] = queue
        return super().retry(*args, **options)  # type: ignore[arg-type]


def declare_topology(*, delayed_delivery: bool = True) -> None:
    """Declare every queue of the topology and, with it, native delayed delivery's exchanges and bindings.

    Workers do this at start (not only for the queues they consume: the delayed-delivery step binds all the
    app's queues). Publishers do it once before their first delayed publish, because on a fresh broker a
    countdown published before any worker has started would find no `celery_delayed_27` exchange.
    """
    global _topology_declared
    with current_app.connection_for_write() as conn:
        channel = conn.default_channel
        for queue in current_app.conf.task_queues:
            queue(channel).declare()
        if delayed_delivery:
            declare_delayed_delivery(conn)
    _topology_declared = True


def declare_delayed_delivery(conn: Any) -> None:
    """Declare native delayed delivery's exchanges and queues on `conn`; bind the work queues to them."""
    declare_native_delayed_delivery_exchanges_and_queues(conn, "quorum")
    for queue in current_app.conf.task_queues:
        if not queue.name.startswith("dead."):
            bind_queue_to_native_delayed_delivery_exchange(conn, queue)


def ensure_topology() -> None:
    """Declare the topology once per process (see declare_topology)."""
    if not _topology_declared:
        declare_topology()


@worker_init.connect(weak=False)
def _declare_topology_on_worker_start(sender: object = None, **kwargs: object) -> None:
    # The worker's own delayed-delivery step declares its exchanges and bindings right after this.
    declare_topology(delayed_delivery=False)


# kombu's native delayed delivery: 28 levels of delay queues, one bit of the countdown each.
DELAY_LEVELS = 28


def purge_queues(app: Any) -> None:
    """Drop every message in the app's vhost: work, dead-letter and delayed-delivery queues.

    For test runs and benchmarks, which reuse one vhost each instead of deleting and re-creating it: on
    RabbitMQ 3.10 a vhost added while another one (with quorum queues) is still being deleted has wedged the
    whole node, so no new connection was ever answered (docs/operations.md).
    """
    with app.connection_for_write() as conn:
        channel = conn.channel()
        # A purge of a quorum queue is a command in its replicated log, written to disk, even when there is nothing
        # to drop; asking for the count is not. Most queues are empty between tests.
        for queue in app.amqp.queues.values():
            try:
                bound = queue(channel)
                bound.declare()
                if bound.queue_declare(passive=True)[1]:
                    bound.purge()
            except Exception:  # a queue the broker refuses (another shape): a fresh channel, on to the next
                channel = conn.channel()
        for level in range(DELAY_LEVELS):
            try:
                if channel.queue_declare(f"celery_delayed_{level}", passive=True)[1]:
                    channel.queue_purge(f"celery_delayed_{level}")
            except Exception:  # not declared yet (no countdown was ever published here)
                channel = conn.channel()


# Infrastructure errors (the database went away, the broker refused a page's messages) retry with backoff; the
# checkpoint makes a retried fan-out run resume where it stopped. Each retry names the queue its message came
# from (OwnQueueTask): routed by the delayed message's own routing key, a second retry was lost.
INFRA_RETRY: dict[str, Any] = {
    "base": OwnQueueTask,
    "autoretry_for": (OperationalError, InterfaceError),
    "retry_backoff": 2,
    "retry_backoff_max": 60,
    "retry_jitter": True,
    "max_retries": 10,
}
