"""Idempotency keys: Redis SET NX as the fast path, the unique (client, dedup_key) index as the truth.

Redis only ever saves work; it never decides alone. A key found in Redis still has to be matched to a committed
notification (or to the request that is committing it right now, which the unique index makes us wait for).
If Redis is down, every request simply takes the database path.
"""

from __future__ import annotations

import logging
from typing import cast

import redis
from django.conf import settings

from notifier.redis import get_redis, rkey

logger = logging.getLogger(__name__)


def _key(client_id: int, dedup_key: str) -> str:
    return rkey("dedup", client_id, dedup_key)


def claim(*, client_id: int, dedup_key: str, notification_id: str, request_hash: str) -> tuple[bool, str | None]:
    """Try to reserve `dedup_key` for a new notification.

    Returns (won, existing): `won` is True when this request may create the notification (or Redis is
    unavailable); otherwise `existing` is "<notification id>|<request hash>" of the first request.
    """
    try:
        r = get_redis()
        value = f"{notification_id}|{request_hash}"
        if r.set(_key(client_id, dedup_key), value, nx=True, ex=settings.DEDUP_TTL_SECONDS):
            return True, None
        # get_redis() decodes responses: a str (redis-py types it bytes | str for any client).
        return False, cast("str | None", r.get(_key(client_id, dedup_key)))
    except redis.RedisError as exc:
        logger.warning("dedup fast path degraded, using the database only: %s", type(exc).__name__)
        return True, None


def release(*, client_id: int, dedup_key: str, notification_id: str) -> None:
    """Drop a reservation whose notification was never committed, so a retry of the request can succeed."""
    try:
        r = get_redis()
        key = _key(client_id, dedup_key)
        value = cast("str | None", r.get(key))  # a decoding client: str
        if value and value.split("|", 1)[0] == notification_id:
            r.delete(key)
    except redis.RedisError:
        # The database is the truth; a stale reservation only costs the next request a database lookup.
        pass


def remember(entries: list[tuple[int, str, str, str]]) -> None:
    """Record (client_id, dedup_key, notification_id, request_hash) of committed notifications in one round trip.

    The batch path writes through the database first; this only gives later single requests the fast path.
    """
    if not entries:
        return
    try:
        pipe = get_redis().pipeline(transaction=False)
        for client_id, dedup_key, notification_id, request_hash in entries:
            pipe.set(
                _key(client_id, dedup_key), f"{notification_id}|{request_hash}", nx=True, ex=settings.DEDUP_TTL_SECONDS
            )
        pipe.execute()
    except redis.RedisError as exc:
        logger.warning("dedup fast path not updated for a batch: %s", type(exc).__name__)
