"""Celery tasks of the channel workers: thin wrappers that hand ids to the delivery pipeline."""

from __future__ import annotations

import os

from celery import shared_task
from django.db import InterfaceError, OperationalError

from channels_app.services import deliver


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
