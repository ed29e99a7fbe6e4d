"""Celery tasks of the preferences app (thin: they call a service)."""

from __future__ import annotations

from celery import shared_task

from preferences.digest import digest_flush


# Routed to the default "maintenance" queue, next to the other sweepers.
@shared_task(name="preferences.tasks.flush_digests", ignore_result=True)
def flush_digests(frequency: str) -> int:
    """Send the waiting hourly or daily digests ("hourly_digest" / "daily_digest"); return how many."""
    return digest_flush(frequency=frequency)
