"""Celery tasks of the channel workers: thin wrappers that hand ids to the delivery pipeline."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Retry
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from channels_app.gather import Gathered, gather, gather_limit
from channels_app.services import deliver
from channels_app.statusevents import status_events_send, status_events_sweep
from core import metrics, task_names
from core.group_commit import GroupCommit
from core.queues import OwnQueueTask, own_queue

__all__ = ["db_retry_countdown", "own_queue", "send_deliveries", "send_status_events", "sweep_status_events"]

# The database being away is not the message's fault: the message is retried (re-published with a delay) for
# as long as the outage lasts, never dead-lettered. The delay grows to this cap, so the send resumes within
# about this long of the database's return.
DB_RETRY_MAX_SECONDS = float(settings.SEND_TASK_DB_RETRY_MAX_SECONDS)


@dataclass(frozen=True, slots=True)
class SendCounts:
    """What one send task's batch did, as the task returns it (results are not stored; Celery logs it).

    A dataclass rather than a dict: Celery's tracer takes a safe repr of every return value, whether or not
    anything logs it, and a dict's cost seven times as much (about 16 µs against 2.5, per message).
    """

    claimed: int
    sent: int
    failed: int
    retried_with: int = 0  # ids carried by the batch's retry (the database was away)


def db_retry_countdown(retries: int) -> float:
    """Return the delay before re-running a send task that could not reach the database (full jitter)."""
    cap = min(DB_RETRY_MAX_SECONDS, 2.0 * (2**retries))
    return random.uniform(min(1.0, cap), cap)


@shared_task(
    bind=True,
    name=task_names.SEND_DELIVERIES,
    max_retries=None,
    # A per-process ceiling on messages per second (e.g. "200/s"); off by default. The real provider limit
    # is the shared Redis bucket in core.ratelimit, which holds across every worker and host.
    rate_limit=settings.SEND_TASK_RATE_LIMIT,
)
def send_deliveries(self: Task[Any, Any], delivery_ids: list[int]) -> SendCounts:
    """Deliver a batch of deliveries (one id for a transactional send, hundreds on the fan-out path).

    Fewer ids than the provider sends at once are sent together with the other small send tasks of the same
    queue that this process is running (`_combiner`) and with the messages waiting behind them on the queue
    (channels_app.gather): a burst of singles is sent as batches, a lone one at once.
    """
    # Name the queue: a retry routed by exchange and routing key alone (Celery's default, taken from the
    # delivery info) goes through native delayed delivery and is never delivered back.
    queue = own_queue((self.request.delivery_info or {}).get("routing_key") or "")
    ids = [int(i) for i in delivery_ids]
    if not queue or len(ids) >= gather_limit(queue):
        return _send_batch(_Send(self, queue, ids))
    return _combiner(queue).submit(_Send(self, queue, ids))


@dataclass(frozen=True)
class _Send:
    """One send task's work: its task (for a retry), its queue and the ids its message carried."""

    task: Task[Any, Any]
    queue: str | None  # None: a routing key of no known queue (nothing to gather from)
    ids: list[int]


def _send_batch(work: _Send) -> SendCounts:
    """Gather what waits on the queue behind `work`'s ids, deliver it as one batch, settle the taken messages."""
    batch = gather(work.queue, work.ids) if work.queue else Gathered(ids=work.ids)
    try:
        report = deliver(batch.ids)
    except (OperationalError, InterfaceError) as exc:
        # Provider errors never reach here (they are per delivery); this is infrastructure. Drop the broken
        # connection so the next run reconnects, and put the message back with a delay: one message for every
        # id of the batch, published (confirmed) before the gathered messages are acknowledged.
        connection.close()
        try:
            # queue=None (a routing key of no known queue) routes as if none were named; the stubs want a name.
            retry = work.task.retry(
                args=(batch.ids,),
                exc=exc,
                countdown=db_retry_countdown(work.task.request.retries),
                queue=work.queue,  # type: ignore[arg-type]
                throw=False,
            )
        except BaseException:
            batch.requeue()
            raise
        batch.ack()
        raise retry from None
    except BaseException:
        batch.requeue()
        raise
    batch.ack()
    return SendCounts(claimed=report.claimed, sent=report.sent, failed=report.failed)


def _send_together(works: Sequence[_Send]) -> list[SendCounts | BaseException]:
    """Deliver the ids of several send tasks of one queue as one batch, on the first one's thread.

    Each task gets the batch's report, and its message is acknowledged when its own thread returns, after the
    outcomes are written (a worker killed before that has every message handed out again; the claim makes the
    repeat harmless). If the database was away, the first task's retry carries every id, published before any
    message is acknowledged: the others end as done, their ids travel with it. Any other failure is every
    task's own, as if each had run alone (one delivery's failure never gets here: the pipeline fails it alone).
    """
    ids = list(dict.fromkeys(i for work in works for i in work.ids))
    metrics.count_combined(works[0].queue or "", len(works) - 1)
    try:
        report = _send_batch(_Send(works[0].task, works[0].queue, ids))
    except Retry as retry:
        carried = SendCounts(claimed=0, sent=0, failed=0, retried_with=len(ids))
        return [retry, *([carried] * (len(works) - 1))]
    return [report] * len(works)


_combiners: dict[str, GroupCommit[_Send, SendCounts]] = {}
_combiners_lock = threading.Lock()


def _combiner(queue: str) -> GroupCommit[_Send, SendCounts]:
    """Return this process's combiner of `queue`'s small send tasks.

    A small send task (a single, or a few coalesced by the API) sends at once when no batch of its queue is in
    flight in this process, so a lone OTP never waits. While one is, the tasks that start meanwhile (the
    process's other threads, fed by its prefetched messages) wait, and the next of them sends all their ids as
    one batch, bounded by the provider's calls at once: a burst of singles pays one claim, one load, one
    outcome write per batch instead of per message. A prefork child runs one task at a time and never combines.
    A batch held open (a receiver that hangs or drips, up to the call deadline) holds the tasks behind it for
    SEND_COMBINE_MAX_WAIT_SECONDS at most: then they send beside it, combined among themselves.
    """
    with _combiners_lock:
        found = _combiners.get(queue)
        if found is None:
            found = _combiners[queue] = GroupCommit(
                write_one=_send_batch,
                write_group=_send_together,
                max_size=gather_limit(queue),
                max_wait=settings.SEND_COMBINE_MAX_WAIT_SECONDS,
            )
        return found


@shared_task(
    base=OwnQueueTask,
    name=task_names.SEND_STATUS_EVENTS,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=5,
)
def send_status_events(endpoint_id: int) -> int:
    """Send one event endpoint's pending status events (queue `events`)."""
    return status_events_send(endpoint_id=int(endpoint_id))


@shared_task(name=task_names.SWEEP_STATUS_EVENTS)
def sweep_status_events() -> int:
    """Wake the senders of endpoints with due pending events (periodic, on queue `events`)."""
    return status_events_sweep()
