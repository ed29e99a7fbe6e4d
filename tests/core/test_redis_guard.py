"""A Redis guard degrades to its fallback on errors, and waits before trying Redis again unless told to retry."""

from __future__ import annotations

from typing import Any

import redis
from django.conf import settings

from core.redis_guard import RedisGuard, redis_guards_retry
from tests.redis_server import free_port


def test_a_degraded_guard_waits_before_redis_unless_told_to_retry_at_once() -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    live = redis.Redis.from_url(settings.REDIS_URL)
    target: dict[str, Any] = {"client": dead}
    guard = RedisGuard("test guard", lambda: target["client"])

    def ping(client: redis.Redis) -> str:
        return "redis" if client.ping() else "no answer"

    assert guard.run(ping, lambda: "fallback") == "fallback"
    assert guard.degraded
    target["client"] = live  # Redis is back (the process's Redis URL changed, as a test's fixture does)
    assert guard.run(ping, lambda: "fallback") == "fallback"  # within its wait, the guard does not ask
    redis_guards_retry()
    assert guard.run(ping, lambda: "fallback") == "redis"
    assert not guard.degraded
