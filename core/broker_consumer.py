"""The workers' Celery consumer: Celery's own, with its delayed-delivery set-up made through the failover list.

One more step wakes the event loop every second (ShutdownTick): see its docstring.

Celery's DelayedDelivery bootstep declares native delayed delivery's exchanges and queues, and binds the work
queues to them, on every URL of the broker failover list in turn, and retries a URL that refuses three times
(sleeping 1, 3 and 5 s, each try also spending kombu's connect timeout). It runs at every consumer restart,
after the consumer has reconnected and before its event loop takes a single message. With one node of the
cluster dead, a worker already reconnected to a live node therefore consumed nothing for about 17 s: every OTP
accepted meanwhile waited that long (docs/cluster.md, decision 0103).

The nodes of a RabbitMQ cluster share their exchanges, queues and bindings, and a failover list names the nodes of
one cluster, so declaring them once through whichever node answers declares them on every node. This step does
that: one connection over the whole list, which skips a refusing node at once as the consumer's own connection
does, one try, and a warning instead of a delay when it fails (the declarations are durable, the publishers'
ensure_topology declares them too, and the next restart tries again).

Only the process's first start waits for it. At a restart (the consumer reconnected after losing its node) the
topology is already on the cluster, durable, and declaring it again is some 120 round trips (28 delay queues, their
exchanges, a binding per work queue), each a cluster-wide change: 0.9 to 2.6 s on a loaded cluster of three that
has just lost a node, during which the reconnected consumer took no message (an OTP waited that long). A restart
declares beside the consumer instead, on a thread of its own.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import bootsteps
from celery.worker.consumer import Consumer as CeleryConsumer
from celery.worker.consumer.delayed_delivery import DelayedDelivery

from core.queues import declare_delayed_delivery

logger = logging.getLogger(__name__)

_CELERY_STEP = "celery.worker.consumer.delayed_delivery:DelayedDelivery"

# The process that declared the topology once (a forked child starts over), and one declaration at a time.
_declared_in = 0
_declaring = threading.Lock()


class FailoverDelayedDelivery(DelayedDelivery):
    """Declare delayed delivery's topology once, through the failover list, without retrying a dead node."""

    def start(self, c: CeleryConsumer) -> None:
        """Declare the exchanges and queues and bind the work queues, through the first node that answers.

        The first start waits for it; a restart runs it beside the consumer (see the module's docstring).
        """
        if _declared_in == os.getpid():
            threading.Thread(target=_declare, args=(c.app,), name="delayed-delivery-setup", daemon=True).start()
        else:
            _declare(c.app)


def _declare(app: Any) -> None:
    """Declare the topology through the first node that answers; one declaration at a time, a failure logged."""
    global _declared_in
    if not _declaring.acquire(blocking=False):
        return  # a restart's declaration is still running: it declares the same things
    try:
        with app.connection_for_write() as connection:
            declare_delayed_delivery(connection)
        _declared_in = os.getpid()
    except Exception as exc:  # consuming matters more: the topology is durable and declared again later
        logger.warning("delayed delivery set-up failed, consuming anyway: %s", exc)
    finally:
        _declaring.release()


# How often the event loop wakes with nothing to do: the longest a SIGTERM waits before the warm shutdown begins.
SHUTDOWN_TICK_SECONDS = 1.0


def _tick() -> None:
    """Do nothing: a timer entry exists so that the event loop's poll returns."""


class ShutdownTick(bootsteps.StartStopStep):
    """Wake the event loop every SHUTDOWN_TICK_SECONDS, so that a warm shutdown starts within that.

    Celery's signal handler only sets a flag, which the event loop reads between polls, and the poll waits for the
    next timer entry, up to 10 s: a SIGTERM (a deploy, a rolling restart, a test's teardown) left an idle worker
    running 9 s more before it began to stop. One timer entry a second costs nothing measurable.
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: CeleryConsumer, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._entry: Any = None

    def start(self, parent: CeleryConsumer) -> None:
        """Start the timer entry on the worker's event loop (none without one: nothing then waits on a poll)."""
        hub = getattr(parent, "hub", None)  # set by the worker; celery-types does not declare it
        if hub is not None and self._entry is None:
            self._entry = hub.call_repeatedly(SHUTDOWN_TICK_SECONDS, _tick)

    def stop(self, parent: CeleryConsumer) -> None:
        """Cancel the timer entry (a consumer restart starts a new one)."""
        if self._entry is not None:
            self._entry.cancel()
            self._entry = None

    shutdown = stop


class Consumer(CeleryConsumer):
    """Celery's consumer with FailoverDelayedDelivery in place of Celery's DelayedDelivery step, and ShutdownTick."""

    # celery-types declares Blueprint as an attribute, not a class; Celery subclasses it like this itself.
    class Blueprint(CeleryConsumer.Blueprint):  # type: ignore[misc,valid-type]
        """Celery's consumer steps, the delayed-delivery one replaced, and the shutdown tick."""

        default_steps = [
            *(
                f"{__name__}:FailoverDelayedDelivery" if step == _CELERY_STEP else step
                for step in CeleryConsumer.Blueprint.default_steps
            ),
            f"{__name__}:ShutdownTick",
        ]
