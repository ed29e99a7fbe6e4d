"""Celery tasks of the channel workers: thin wrappers that hand ids to the delivery pipeline."""

from __future__ import annotations

import os

from celery import shared_task
from django.db import InterfaceError, OperationalError

from channels_app.services import deliver
from channels_app.statusevents import status_events_send, status_events_sweep


@shared_task(
    name="channels_app.tasks.send_deliveries",
    # Infrastructure errors (the database went away) retry the whole message with backoff and jitter; provider
    # errors never reach here: they are per delivery and handled by the pipeline. Once these retries are
    # exhausted the task fails, and with acks_on_failure_or_timeout off the message is rejected to dead.<channel>.
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=2,
    retry_backoff_max=120,
    retry_jitter=True,
    max_retries=8,
    # A per-process ceiling on messages per second (e.g. "200/s"); off by default. The real provider limit
    # is the shared Redis bucket in channels_app.ratelimit, which holds across every worker and host.
    rate_limit=os.environ.get("SEND_TASK_RATE_LIMIT") or None,
)
def send_deliveries(delivery_ids: list[int]) -> dict[str, int]:
    """Deliver a batch of deliveries (one id for a transactional send, hundreds on the fan-out path)."""
    report = deliver([int(i) for i in delivery_ids])
    return {"claimed": report.claimed, "sent": report.sent, "failed": report.failed}


@shared_task(
    name="channels_app.tasks.send_status_events",
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=5,
)
def send_status_events(endpoint_id: int) -> int:
    """Send one event endpoint's pending status events (queue `events`)."""
    return status_events_send(endpoint_id=int(endpoint_id))


@shared_task(name="channels_app.tasks.sweep_status_events")
def sweep_status_events() -> int:
    """Wake the senders of endpoints with due pending events (periodic, on queue `events`)."""
    return status_events_sweep()
