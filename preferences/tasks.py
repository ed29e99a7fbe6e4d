"""Celery tasks of the preferences app (thin: they call a service)."""

from __future__ import annotations

from celery import shared_task

from notifier.digest import daily_digest_hour, digest_flush, normalise_frequency


# Routed to the default "maintenance" queue, next to the other sweepers.
@shared_task(name="preferences.tasks.flush_digests", ignore_result=True)
def flush_digests(frequency: str) -> int:
    """Send the waiting hourly digests, or the daily ones of recipients whose local hour it is; return how many."""
    if normalise_frequency(frequency) == "daily_digest":
        return digest_flush(frequency=frequency, local_hour=daily_digest_hour())
    return digest_flush(frequency=frequency)
