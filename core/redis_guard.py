"""The shared Redis connection, key naming, and the guard that keeps Redis a fast path, never a dependency.

The rate limiter and the circuit breaker both keep their shared state in Redis through a `RedisGuard`: on a
Redis error they fall back to per-process state instead of failing the send.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings

logger = logging.getLogger(__name__)
# After a Redis error, use the in-memory fallback for this long before trying Redis again, so a dead Redis
# costs one connect timeout per period, not one per batch.
REDIS_RETRY_SECONDS = 5.0


@functools.cache
def get_redis() -> redis.Redis:
    """Return the process-wide Redis client (short timeouts: Redis is a fast path, never a dependency)."""
    return redis.Redis.from_url(
        settings.REDIS_URL,
        socket_connect_timeout=0.5,
        socket_timeout=0.5,
        health_check_interval=30,
        decode_responses=True,
    )


def rkey(*parts: object) -> str:
    """Return a Redis key under this deployment's prefix."""
    return settings.REDIS_KEY_PREFIX + ":".join(str(p) for p in parts)


class RedisGuard:
    """Run Redis calls, switching to a fallback on errors; log once on degrading and once on recovery."""

    def __init__(self, name: str, client: redis.Redis | Callable[[], redis.Redis] | None = None) -> None:
        self.name = name
        self._client = client
        self.retry_seconds = REDIS_RETRY_SECONDS
        self._down_until = 0.0
        self.degraded = False
        self._lock = threading.Lock()

    def client(self) -> redis.Redis:
        """Return the Redis client: the injected one, or the process-wide one."""
        if self._client is None:
            return get_redis()
        if isinstance(self._client, redis.Redis):
            return self._client
        return self._client()

    def run(self, call: Callable[[redis.Redis], Any], fallback: Callable[[], Any]) -> Any:
        """Return `call(client)`, or `fallback()` while Redis is failing."""
        if self.degraded and time.monotonic() < self._down_until:
            return fallback()
        try:
            result = call(self.client())
        except (redis.RedisError, OSError) as exc:
            with self._lock:
                self._down_until = time.monotonic() + self.retry_seconds
                if not self.degraded:
                    self.degraded = True
                    logger.warning(
                        "%s: Redis unavailable (%s); degraded to per-process in-memory state",
                        self.name,
                        type(exc).__name__,
                    )
            return fallback()
        if self.degraded:
            with self._lock:
                if self.degraded:
                    self.degraded = False
                    logger.warning("%s: Redis reachable again; shared state restored", self.name)
        return result
