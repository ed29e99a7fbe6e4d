"""Background tasks of the delivery log: the outbox relay, fallback timers and sweeps, archive erasure (thin)."""

from __future__ import annotations

import datetime as dt

from celery import shared_task

from core import task_names
from core.queues import INFRA_RETRY
from notifier.deliveries import fallback
from notifier.deliveries.outbox import relay


@shared_task(name=task_names.OUTBOX_RELAY)
def outbox_relay() -> dict[str, int]:
    """Publish deliveries the fast path missed and wake those now due."""
    return relay()


@shared_task(name=task_names.FALLBACK_DUE, **INFRA_RETRY)
def fallback_due(delivery_ids: list[int]) -> dict[str, int]:
    """Decide the fallback chains of these pending deliveries now that their deadline has come."""
    decisions = fallback.fallback_decide(delivery_ids=[int(i) for i in delivery_ids])
    return {"started": len(decisions.started), "skipped": len(decisions.skipped)}


@shared_task(name=task_names.FALLBACK_SWEEP)
def fallback_sweep() -> int:
    """Decide fallback chains whose deadline passed without a decision (a lost or long timer)."""
    return fallback.fallback_sweep()


@shared_task(name=task_names.ARCHIVE_FORGET_RECIPIENT, **INFRA_RETRY)
def archive_forget_recipient(recipient_id: int, since: str | None = None) -> list[str]:
    """Anonymise an erased recipient's rows in the archived days (notifier.deliveries.archive)."""
    from notifier.deliveries import archive

    days = archive.archive_forget_recipient(
        recipient_id=recipient_id, since=dt.date.fromisoformat(since) if since else None
    )
    return [day.isoformat() for day in days]
