"""The shared Redis connection and key naming."""

from __future__ import annotations

import functools

import redis
from django.conf import settings


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
