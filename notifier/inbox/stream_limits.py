"""Concurrent inbox streams per inbox token and per recipient, counted across every stream process in Redis.

An inbox token is handed to a browser, so whoever holds it could otherwise open streams without end, each a
socket and a queue in a stream process. Each open stream holds a *lease*: a member of two Redis sorted sets
(one per token, one per recipient) scored by its expiry. Opening a stream drops expired leases and adds one in
a single Lua script, refused when either set is full; closing it removes the lease; a background task renews
the leases of the process's open streams every third of INBOX_STREAM_LEASE_SECONDS, so the leases of a process
that died without closing them expire on their own after at most that long.

Redis is a fast path here as everywhere (core/redis_guard.py): while it is unreachable the limits are counted
in this process only, which still bounds what one connection to one process can hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis
from django.conf import settings

from core.redis_guard import new_async_redis, rkey

log = logging.getLogger(__name__)

# Returns 0 when the lease was taken, 1 when the token's set is full, 2 when the recipient's set is full.
_ACQUIRE = """
local now, expiry = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if tonumber(ARGV[4]) > 0 and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 1 end
if tonumber(ARGV[5]) > 0 and redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then return 2 end
redis.call('ZADD', KEYS[1], expiry, ARGV[3])
redis.call('ZADD', KEYS[2], expiry, ARGV[3])
redis.call('PEXPIREAT', KEYS[1], math.ceil(expiry * 1000))
redis.call('PEXPIREAT', KEYS[2], math.ceil(expiry * 1000))
return 0
"""

# Renews a slice of leases: KEYS are (token key, recipient key) pairs, ARGV the expiry, the keys' expiry time
# and then each pair's member. XX: a lease released meanwhile is not brought back.
_RENEW = """
local expiry, keys_expire = ARGV[1], tonumber(ARGV[2])
for i = 1, #KEYS, 2 do
  local member = ARGV[2 + (i + 1) / 2]
  redis.call('ZADD', KEYS[i], 'XX', expiry, member)
  redis.call('ZADD', KEYS[i + 1], 'XX', expiry, member)
  redis.call('EXPIREAT', KEYS[i], keys_expire)
  redis.call('EXPIREAT', KEYS[i + 1], keys_expire)
end
return #KEYS / 2
"""

OK, TOKEN_FULL, RECIPIENT_FULL = 0, 1, 2
# Leases renewed per script call. One call per slice, not four commands per lease: the client packs and parses
# in Python, and 10,000 streams' 40,000 commands cost a stream process seconds of CPU every renewal, taken from
# the bursts it pushes; a slice's arguments are packed in well under a millisecond, so the event loop is never
# held for long either.
RENEW_SLICE = 250


@dataclass(frozen=True)
class Lease:
    """One open stream's claim on its token's and its recipient's limits."""

    member: str
    token_key: str
    recipient_key: str
    token_id: str
    recipient_id: int


class StreamLeases:
    """The process's leases, their renewal, and the per-process counts used while Redis is unreachable."""

    def __init__(self) -> None:
        self._client: aioredis.Redis | None = None
        self._prefix = uuid.uuid4().hex[:12]
        self._ids = itertools.count(1)
        self._live: dict[str, Lease] = {}
        self._by_token: Counter[str] = Counter()
        self._by_recipient: Counter[int] = Counter()
        self._renewer: asyncio.Task[None] | None = None

    def _redis(self) -> aioredis.Redis:
        if self._client is None:
            self._client = new_async_redis()
        return self._client

    async def acquire(self, *, token: str, recipient_id: int) -> tuple[Lease | None, int]:
        """Take a lease for a new stream; return (lease, OK) or (None, TOKEN_FULL or RECIPIENT_FULL)."""
        token_id = hashlib.sha256(token.encode()).hexdigest()[:32]
        lease = Lease(
            member=f"{self._prefix}:{next(self._ids)}",
            token_key=rkey("inbox-streams", "token", token_id),
            recipient_key=rkey("inbox-streams", "recipient", recipient_id),
            token_id=token_id,
            recipient_id=recipient_id,
        )
        per_token, per_recipient = settings.INBOX_STREAM_MAX_PER_TOKEN, settings.INBOX_STREAM_MAX_PER_RECIPIENT
        now = time.time()
        try:
            verdict = int(
                await self._redis().eval(
                    _ACQUIRE,
                    2,
                    lease.token_key,
                    lease.recipient_key,
                    str(now),
                    str(now + settings.INBOX_STREAM_LEASE_SECONDS),
                    lease.member,
                    str(per_token),
                    str(per_recipient),
                )
            )
        except (redis.RedisError, OSError) as exc:
            log.warning("inbox stream limits: Redis unavailable (%s); counting in this process", type(exc).__name__)
            verdict = self._local_verdict(lease, per_token, per_recipient)
        if verdict != OK:
            return None, verdict
        self._live[lease.member] = lease
        self._by_token[token_id] += 1
        self._by_recipient[recipient_id] += 1
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew(), name="inbox-stream-leases")
        return lease, OK

    def _local_verdict(self, lease: Lease, per_token: int, per_recipient: int) -> int:
        if per_token > 0 and self._by_token[lease.token_id] >= per_token:
            return TOKEN_FULL
        if per_recipient > 0 and self._by_recipient[lease.recipient_id] >= per_recipient:
            return RECIPIENT_FULL
        return OK

    async def release(self, lease: Lease) -> None:
        """Give a closed stream's lease back (if Redis is unreachable, the lease expires on its own)."""
        if self._live.pop(lease.member, None) is None:
            return
        self._by_token[lease.token_id] -= 1
        if self._by_token[lease.token_id] <= 0:
            del self._by_token[lease.token_id]
        self._by_recipient[lease.recipient_id] -= 1
        if self._by_recipient[lease.recipient_id] <= 0:
            del self._by_recipient[lease.recipient_id]
        try:
            async with self._redis().pipeline(transaction=False) as pipe:
                pipe.zrem(lease.token_key, lease.member)
                pipe.zrem(lease.recipient_key, lease.member)
                await pipe.execute()
        except (redis.RedisError, OSError):
            log.warning("inbox stream limits: could not release a lease; it expires on its own")

    async def _renew(self) -> None:
        """Push the expiry of every open stream's lease forward, every third of the lease time."""
        while self._live:
            interval = settings.INBOX_STREAM_LEASE_SECONDS / 3
            await asyncio.sleep(interval)
            expiry = time.time() + settings.INBOX_STREAM_LEASE_SECONDS
            leases = list(self._live.values())
            with contextlib.suppress(redis.RedisError, OSError):
                renew = self._redis().register_script(_RENEW)
                for start in range(0, len(leases), RENEW_SLICE):
                    part = leases[start : start + RENEW_SLICE]
                    keys = [key for lease in part for key in (lease.token_key, lease.recipient_key)]
                    await renew(keys=keys, args=[expiry, int(expiry) + 1, *(lease.member for lease in part)])


_leases: StreamLeases | None = None


def leases() -> StreamLeases:
    """Return this process's stream leases (created on the first stream, inside the server's event loop)."""
    global _leases
    if _leases is None:
        _leases = StreamLeases()
    return _leases
