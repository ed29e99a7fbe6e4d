"""Take the send messages waiting on a queue into the batch a worker is about to send.

Singles arrive one delivery id per broker message (or a few, as the API's publisher coalesces them). Sent one
message at a time, each pays a whole batch's fixed costs: the claim, the load, render setup, the outcome write,
its events, and Celery's own per-message work. So a send task that receives fewer ids than its provider sends
at once first takes the messages waiting behind its own on the same queue (what the queue reports ready, no
waiting for more: behind a lone OTP the queue is empty and it leaves at once) and sends all their ids as one
batch.

Effectively-once is untouched: a taken message stays unacknowledged on this thread's own broker channel until
the batch's outcomes are written, exactly like the task's own message under late acks. If the worker dies, the
broker hands them out again and the claim makes the repeat harmless; if the batch cannot reach the database,
the task's retry carries every id (its publish confirmed before these are acknowledged); anything else puts
them back on the queue. Only messages already on the queue are taken, so broker-delayed messages (retries,
paced fan-out pages, rate-capped campaigns) keep their time, and each priority keeps its own queue.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from celery import current_app
from django.conf import settings

from channels_app.providers import registry
from core import metrics, task_names
from core.queues import broker_recently_down, mark_broker_down
from notifier.deliveries.outbox import publish

logger = logging.getLogger(__name__)

# A message due later than this (its ETA ahead of this host's clock) is not sent early: it is published again
# with the rest of its delay. Native delayed delivery normally brings messages back only once due.
_EARLY_SECONDS = 1.0
# How long a gather waits for the messages the broker said were ready, at most and after the last one arrived.
_CONSUME_WAIT_SECONDS = 0.05
_CONSUME_IDLE_SECONDS = 0.003
# RabbitMQ counts a quorum queue's ready messages by asking the leader it has on record, and gives up after 250 ms:
# while that leader hangs (until its peers drop it, net_ticktime later) every count costs that much, and the
# gathers of a worker's threads, one at a time under the queue's lock, made each batch take 0.26 to 0.62 s: fewer
# left than arrived, and OTPs fell seconds behind. Gathering only saves work, so a queue whose count takes longer
# than this is not counted again for a while: its batches go as they are.
_SLOW_COUNT_SECONDS = 0.1
_SLOW_COUNT_PAUSE_SECONDS = 5.0


@dataclass
class Gathered:
    """The ids to send as one batch and the taken messages they came with (unacknowledged until settled)."""

    ids: list[int]
    messages: list[Any] = field(default_factory=list)
    # The gather connection the messages are unacknowledged on.
    source: _Broker | None = field(default=None, compare=False, repr=False)

    def ack(self) -> None:
        """Acknowledge the taken messages: their deliveries' outcomes are written (or carried by a retry)."""
        self._settle("ack")

    def requeue(self) -> None:
        """Put the taken messages back on their queue (the batch failed before writing their outcomes)."""
        self._settle("requeue")

    def _settle(self, how: str) -> None:
        messages, self.messages = self.messages, []
        if not messages or self.source is None:
            return
        with self.source.lock:
            for message in messages:
                try:
                    message.ack() if how == "ack" else message.requeue()
                except Exception as exc:  # the channel is gone: the broker hands the message out again (harmless)
                    logger.warning("could not %s a gathered send message: %s", how, type(exc).__name__)
                    self.source.drop()
                    return


class _Broker:
    """The broker channel a process gathers one queue's messages on, shared by its threads under a lock.

    One connection per process and queue, not per thread: a threads pool of eight would otherwise hold eight
    more connections to the broker. Gathering under one lock keeps two threads from splitting one backlog into
    halves (the first takes a full batch, the next one the messages after it); a lock per queue keeps an OTP's
    queue from waiting behind a burst on another.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.paused_until = 0.0  # time.monotonic() before which the queue is not counted (a slow count)
        self._pid = 0
        self._connection: Any = None
        self._channel: Any = None

    def channel(self) -> Any:
        """Return the channel, connecting first if needed (call with the lock held)."""
        if self._pid != os.getpid():  # a forked pool child never uses its parent's socket
            self._connection = self._channel = None
            self._pid = os.getpid()
        if self._channel is None:
            # No heartbeats: nothing would send them between tasks, and the broker would close an idle connection.
            connection = current_app.connection_for_read(heartbeat=0)
            try:
                connection.ensure_connection(max_retries=1)
            except Exception:
                # Every task would wait for the connect timeout under the lock: skip the broker for a while.
                mark_broker_down()
                raise
            self._connection, self._channel = connection, connection.channel()
        return self._channel

    def drop(self) -> None:
        """Forget a broken connection (call with the lock held); the next gather connects again."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and self._pid == os.getpid():
            try:
                connection.release()
            except Exception:  # already broken; nothing left to close cleanly
                logger.debug("gather connection close failed", exc_info=True)


_brokers: dict[str, _Broker] = {}
_brokers_lock = threading.Lock()


def _broker_for(queue: str) -> _Broker:
    """Return this process's gather connection for `queue` (made on first use: only queues with traffic)."""
    with _brokers_lock:
        broker = _brokers.get(queue)
        if broker is None:
            broker = _brokers[queue] = _Broker()
        return broker


def gather_limit(queue: str) -> int:
    """Return how many delivery ids a batch from `queue` gathers at most: its first provider's calls at once."""
    if settings.SEND_GATHER_MAX:
        return int(settings.SEND_GATHER_MAX)
    channel = queue.partition(".")[0]
    try:
        return registry.get_provider(registry.chain(channel)[0]).max_concurrency
    except Exception:  # a misconfigured channel fails its deliveries in the pipeline, with the reason
        return 1


def gather(queue: str, ids: Sequence[int]) -> Gathered:
    """Return `ids` plus the ids of the send messages waiting on `queue`, up to the queue's gather limit.

    Never waits for messages to come: it asks the queue what it holds ready and takes that (an empty queue, as
    behind a lone OTP, costs one round trip). A broker that cannot be reached only means nothing is gathered;
    the task's own ids are sent as they are.
    """
    limit = gather_limit(queue)
    gathered = Gathered(ids=list(dict.fromkeys(ids)))
    if len(gathered.ids) >= limit or broker_recently_down():
        return gathered
    declared = current_app.amqp.queues.get(queue)
    if declared is None:
        return gathered
    broker = _broker_for(queue)
    with broker.lock:
        if time.monotonic() < broker.paused_until:
            return gathered
        try:
            for message in _waiting(broker, declared, limit - len(gathered.ids)):
                _take(queue, message, gathered)
        except Exception as exc:  # the broker is away or the channel broke: send what is here
            logger.warning("gathering send messages from %s failed: %s", queue, type(exc).__name__)
            broker.drop()
        if gathered.messages:
            gathered.source = broker
    if gathered.messages:
        metrics.count_gathered(queue, len(gathered.messages))
    return gathered


def _waiting(broker: _Broker, declared: Any, want: int) -> list[Any]:
    """Take up to `want` of the messages ready on a queue; none, at the cost of one round trip, if it holds none.

    Through a consumer of that many messages, registered and cancelled again: on a quorum queue each basic.get is
    a command of its own in the queue's log, one consumer takes its whole window in one. A count slower than
    _SLOW_COUNT_SECONDS pauses the queue's gathering (call with the broker's lock held).
    """
    channel = broker.channel()
    started = time.monotonic()
    # On the py-amqp channel itself: binding kombu's Queue to it first copied the entity on every batch.
    _, ready, _ = channel.queue_declare(queue=declared.name, passive=True)
    took = time.monotonic() - started
    if took > _SLOW_COUNT_SECONDS:
        broker.paused_until = time.monotonic() + _SLOW_COUNT_PAUSE_SECONDS
        metrics.count_gather_paused(declared.name)
        logger.warning(
            "counting %s took %.2f s; not gathering from it for %.0f s", declared.name, took, _SLOW_COUNT_PAUSE_SECONDS
        )
    want = min(want, int(ready or 0))
    if want <= 0:
        return []
    raw: list[Any] = []
    channel.basic_qos(0, want, False)
    tag = channel.basic_consume(queue=declared.name, no_ack=False, callback=raw.append)
    try:
        deadline = time.monotonic() + _CONSUME_WAIT_SECONDS
        while len(raw) < want:
            # The window arrives at once; a message the worker's own consumer took meanwhile never comes, so
            # once some have arrived a short pause ends the wait.
            remaining = min(deadline - time.monotonic(), _CONSUME_IDLE_SECONDS if raw else _CONSUME_WAIT_SECONDS)
            if remaining <= 0:
                break
            try:
                channel.connection.drain_events(timeout=remaining)
            except TimeoutError:
                break
    finally:
        channel.basic_cancel(tag)  # whatever arrives before its answer is still handed to the callback
    return [channel.message_to_python(m) for m in raw]


def _take(queue: str, message: Any, gathered: Gathered) -> bool:
    """Add one taken message's ids to the batch; return False if it was not one to send now (it was handled)."""
    headers = message.headers or {}
    try:
        if headers.get("task") != task_names.SEND_DELIVERIES:
            raise ValueError(f"not a send task: {headers.get('task')!r}")
        args = message.decode()[0]
        ids = [int(i) for i in args[0]]
    except Exception as exc:  # not ours to judge: Celery's consumer rejects (dead-letters) what it cannot run
        logger.warning("a message on %s is not a send batch (%s); left to the consumer", queue, type(exc).__name__)
        message.requeue()
        return False
    delay = _seconds_until(headers.get("eta"))
    if delay > _EARLY_SECONDS:
        # Early (clocks apart): published again with the rest of its delay, never sent before it is due.
        if publish({queue: ids}, countdown=delay) == ids:
            message.ack()
        else:
            message.requeue()
        return False
    gathered.messages.append(message)
    seen = set(gathered.ids)
    gathered.ids.extend(i for i in ids if i not in seen)
    return True


def _seconds_until(eta: Any) -> float:
    """Return the seconds until a Celery ETA header (ISO 8601), 0 for none or an unreadable one."""
    if not eta:
        return 0.0
    try:
        when = datetime.fromisoformat(str(eta))
    except ValueError:
        return 0.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - datetime.now(UTC)).total_seconds()
