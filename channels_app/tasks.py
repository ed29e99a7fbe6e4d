"""Celery tasks of the channel workers: thin wrappers that hand ids to the delivery pipeline."""

from __future__ import annotations

import random
from typing import Any

from celery import Task, shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from channels_app.gather import Gathered, gather
from channels_app.services import deliver
from channels_app.statusevents import status_events_send, status_events_sweep
from core import task_names
from core.queues import OwnQueueTask, own_queue

__all__ = ["db_retry_countdown", "own_queue", "send_deliveries", "send_status_events", "sweep_status_events"]

# The database being away is not the message's fault: the message is retried (re-published with a delay) for
# as long as the outage lasts, never dead-lettered. The delay grows to this cap, so the send resumes within
# about this long of the database's return.
DB_RETRY_MAX_SECONDS = float(settings.SEND_TASK_DB_RETRY_MAX_SECONDS)


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
def send_deliveries(self: Task[Any, Any], delivery_ids: list[int]) -> dict[str, int]:
    """Deliver a batch of deliveries (one id for a transactional send, hundreds on the fan-out path).

    Fewer ids than the provider sends at once take the messages waiting behind them on the same queue along
    (channels_app.gather): a burst of singles is sent as batches, a lone one at once.
    """
    # Name the queue: a retry routed by exchange and routing key alone (Celery's default, taken from the
    # delivery info) goes through native delayed delivery and is never delivered back.
    queue = own_queue((self.request.delivery_info or {}).get("routing_key") or "")
    ids = [int(i) for i in delivery_ids]
    batch = gather(queue, ids) if queue else Gathered(ids=ids)
    try:
        report = deliver(batch.ids)
    except (OperationalError, InterfaceError) as exc:
        # Provider errors never reach here (they are per delivery); this is infrastructure. Drop the broken
        # connection so the next run reconnects, and put the message back with a delay: one message for every
        # id of the batch, published (confirmed) before the gathered messages are acknowledged.
        connection.close()
        try:
            # queue=None (a routing key of no known queue) routes as if none were named; the stubs want a name.
            retry = self.retry(
                args=(batch.ids,),
                exc=exc,
                countdown=db_retry_countdown(self.request.retries),
                queue=queue,  # type: ignore[arg-type]
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
    return {"claimed": report.claimed, "sent": report.sent, "failed": report.failed}


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
