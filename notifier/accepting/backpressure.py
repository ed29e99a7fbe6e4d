"""Shed low-priority load at the API while the low-priority backlog is too deep.

High-priority requests always pass: shedding exists so that a flood of marketing never slows an OTP. The
backlog is the sum of ready messages in the `<channel>.low` queues, read with passive queue declares (the
broker's own count, no management plugin needed) and cached for about a second per process, so a burst of
requests costs one broker round trip per second, not one per request. If the broker cannot be asked, nothing
is shed: accepting is always safe (the outbox relay publishes what the broker missed).

Settings: BACKPRESSURE_LOW_QUEUE_DEPTH (messages, default 50,000; 0 turns shedding off),
BACKPRESSURE_CACHE_SECONDS (default 1.0), BACKPRESSURE_RETRY_AFTER_SECONDS (default 30).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import TYPE_CHECKING, cast

from celery import current_app as celery_app
from django.conf import settings

from core.errors import ApiError
from core.queues import CHANNELS, queue_name

if TYPE_CHECKING:
    from amqp.channel import Channel as AmqpChannel

logger = logging.getLogger(__name__)

DEFAULT_LOW_QUEUE_DEPTH = 50_000
LOW_QUEUES = tuple(queue_name(channel, "low") for channel in CHANNELS)

_lock = threading.Lock()
_cached: tuple[float, int | None] = (0.0, None)  # (monotonic time measured, depth or None when unknown)


class Backlogged(ApiError):
    """A 429 for a low-priority request while the low-priority backlog is over its limit."""

    def __init__(self, *, depth: int, limit: int, retry_after: float) -> None:
        super().__init__(
            429,
            "backlogged",
            f"The low-priority backlog ({depth} messages) is over its limit ({limit}); retry later.",
        )
        # DRF's convention for Retry-After (the `wait` of Throttled); the error handler turns it into the header.
        self.wait = retry_after
        self.retry_after = math.ceil(retry_after)


def low_queue_limit() -> int:
    """Return the backlog (ready messages in the low queues) above which low-priority requests are shed."""
    return int(getattr(settings, "BACKPRESSURE_LOW_QUEUE_DEPTH", DEFAULT_LOW_QUEUE_DEPTH))


def _cache_seconds() -> float:
    return float(getattr(settings, "BACKPRESSURE_CACHE_SECONDS", 1.0))


def _retry_after() -> float:
    return float(getattr(settings, "BACKPRESSURE_RETRY_AFTER_SECONDS", 30.0))


def measure_low_backlog() -> int:
    """Ask the broker how many messages are ready in the low-priority queues (passive declares)."""
    total = 0
    with celery_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
        # RabbitMQ through py-amqp: its channel has queue_declare (kombu's StdChannel does not say so).
        channel = cast("AmqpChannel", conn.default_channel)
        for name in LOW_QUEUES:
            _, ready, _ = cast("tuple[str, int, int]", channel.queue_declare(queue=name, passive=True))
            total += int(ready)
    return total


def low_backlog() -> int | None:
    """Return the low-priority backlog, measured at most once per BACKPRESSURE_CACHE_SECONDS; None if unknown."""
    global _cached
    now = time.monotonic()
    measured_at, depth = _cached
    if now - measured_at < _cache_seconds():
        return depth
    with _lock:
        measured_at, depth = _cached
        if now - measured_at < _cache_seconds():
            return depth
        try:
            depth = measure_low_backlog()
        except Exception as exc:
            logger.warning("low-priority backlog unknown (not shedding): %s", exc)
            depth = None
        _cached = (time.monotonic(), depth)
    return depth


def reset_cache() -> None:
    """Forget the cached measurement (tests, and after changing the limit)."""
    global _cached
    _cached = (0.0, None)


def is_low_priority(*, category: str, priority: str | None) -> bool:
    """Return whether a request travels as low priority: "low", or "normal"/unset in a low-default category."""
    if priority == "high":
        return False
    if priority == "low":
        return True
    default = (settings.NOTIFIER_CATEGORIES.get(category) or {}).get("priority", "normal")
    return default == "low"


def check_backpressure(*, category: str, priority: str | None) -> None:
    """Raise a 429 ApiError for a low-priority request while the backlog is over its limit."""
    limit = low_queue_limit()
    if limit <= 0 or not is_low_priority(category=category, priority=priority):
        return
    depth = low_backlog()
    if depth is not None and depth > limit:
        raise Backlogged(depth=depth, limit=limit, retry_after=_retry_after())
