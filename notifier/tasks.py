"""Periodic and background tasks of the core (scheduled by beat on the maintenance queue)."""

from __future__ import annotations

from celery import shared_task

from notifier.outbox import relay


@shared_task(name="notifier.tasks.outbox_relay")
def outbox_relay() -> dict[str, int]:
    """Publish deliveries the fast path missed and wake those now due."""
    return relay()
