"""The shared Redis connection, key naming, and the guard that keeps Redis a fast path, never a dependency.

The rate limiter and the circuit breaker both keep their shared state in Redis through a `RedisGuard`: on a
Redis error they fall back to per-process state instead of failing the send.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, ClassVar, cast
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.sentinel import Sentinel

logger = logging.getLogger(__name__)
# After a Redis error, use the in-memory fallback for this long before trying Redis again, so a dead Redis
# costs one connect timeout per period, not one per batch.
REDIS_RETRY_SECONDS = 5.0


# Short timeouts: Redis is a fast path, never a dependency.
CLIENT_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": 0.5,
    "socket_timeout": 0.5,
    "health_check_interval": 30,
    "decode_responses": True,
}


def sentinel_addresses() -> list[tuple[str, int]]:
    """Return the (host, port) pairs of REDIS_SENTINELS ("host:port,host:port"), empty when Sentinel is not used."""
    pairs = []
    for item in settings.REDIS_SENTINELS:
        host, _, port = item.strip().rpartition(":")
        pairs.append((host.strip("[]") or "127.0.0.1", int(port or 26379)))
    return pairs


@functools.cache
def get_sentinel() -> Sentinel | None:
    """Return the process-wide Sentinel client when REDIS_SENTINELS is set, else None."""
    addresses = sentinel_addresses()
    if not addresses:
        return None
    auth = {"password": settings.REDIS_SENTINEL_PASSWORD} if settings.REDIS_SENTINEL_PASSWORD else {}
    return Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves Sentinel unannotated
        addresses, sentinel_kwargs={"socket_connect_timeout": 0.5, "socket_timeout": 0.5, **auth}
    )


@functools.cache
def get_redis() -> redis.Redis:
    """Return the process-wide Redis client: REDIS_URL's server, or the master Sentinel names (REDIS_SENTINELS).

    Through Sentinel the client asks the sentinels for the current master on every new connection and drops its
    connections when the server it reached is no longer master, so a failover costs the errors of one RedisGuard
    retry period (the guards' fallbacks cover them), never a restart. REDIS_URL still gives the database number,
    user name and password of the master's connections.
    """
    sentinel = get_sentinel()
    if sentinel is None:
        return redis.Redis.from_url(settings.REDIS_URL, **CLIENT_OPTIONS)
    master = sentinel.master_for(settings.REDIS_SENTINEL_MASTER, **_master_options(), **CLIENT_OPTIONS)  # type: ignore[no-untyped-call]
    return cast(redis.Redis, master)


def new_async_redis() -> aioredis.Redis:
    """Return a new asyncio Redis client (one per event loop), configured like `get_redis`'s."""
    addresses = sentinel_addresses()
    if not addresses:
        return aioredis.Redis.from_url(settings.REDIS_URL, **CLIENT_OPTIONS)
    auth = {"password": settings.REDIS_SENTINEL_PASSWORD} if settings.REDIS_SENTINEL_PASSWORD else {}
    sentinel = AsyncSentinel(  # type: ignore[no-untyped-call]  # redis-py leaves Sentinel unannotated
        addresses, sentinel_kwargs={"socket_connect_timeout": 0.5, "socket_timeout": 0.5, **auth}
    )
    return cast(
        aioredis.Redis, sentinel.master_for(settings.REDIS_SENTINEL_MASTER, **_master_options(), **CLIENT_OPTIONS)
    )


def _master_options() -> dict[str, Any]:
    """Return the database number and credentials of REDIS_URL, for connections to Sentinel's master."""
    url = urlsplit(settings.REDIS_URL)
    return {
        "db": int(url.path.strip("/") or 0),
        "username": unquote(url.username or "") or None,
        "password": unquote(url.password or "") or None,
    }


_scripts: dict[tuple[int, str], redis.commands.core.Script] = {}


def redis_script(source: str) -> redis.commands.core.Script:
    """Return `source` registered with the process's Redis client (EVALSHA, loaded again if Redis forgot it)."""
    client = get_redis()
    script = _scripts.get((id(client), source))
    if script is None:
        script = _scripts[(id(client), source)] = client.register_script(source)
    return script


def rkey(*parts: object) -> str:
    """Return a Redis key under this deployment's prefix."""
    return settings.REDIS_KEY_PREFIX + ":".join(str(p) for p in parts)


class RedisGuard:
    """Run Redis calls, switching to a fallback on errors; log once on degrading and once on recovery."""

    # Every guard of the process (weakly): `redis_guards_retry` lets them all try Redis again at once.
    _all: ClassVar[weakref.WeakSet[RedisGuard]] = weakref.WeakSet()

    def __init__(self, name: str, client: redis.Redis | Callable[[], redis.Redis] | None = None) -> None:
        self.name = name
        self._client = client
        self.retry_seconds = REDIS_RETRY_SECONDS
        self._down_until = 0.0
        self.degraded = False
        self._lock = threading.Lock()
        self._scripts: dict[tuple[int, str], Any] = {}
        RedisGuard._all.add(self)

    def client(self) -> redis.Redis:
        """Return the Redis client: the injected one, or the process-wide one."""
        if self._client is None:
            return get_redis()
        if isinstance(self._client, redis.Redis):
            return self._client
        return self._client()

    def script(self, client: redis.Redis, source: str) -> Any:
        """Return the Lua script `source` registered on `client` (redis-py's Script: EVALSHA, reloaded on NOSCRIPT)."""
        # One Script object per client and source: it hashes once.
        cache_key = (id(client), source)
        script = self._scripts.get(cache_key)
        if script is None:
            script = self._scripts[cache_key] = client.register_script(source)
        return script

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


def redis_guards_retry() -> None:
    """Have every degraded guard of this process try Redis at its next call instead of after its wait.

    For a process that knows Redis is back (its Redis URL was changed): a guard still failing degrades again.
    """
    for guard in list(RedisGuard._all):
        guard._down_until = 0.0
