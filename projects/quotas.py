"""Daily quotas per channel of a project environment: one Redis counter per environment, channel and UTC day.

A project environment may limit what it sends per channel and UTC day (`Environment.quotas`, {"email": 10000}).
The accept asks `quota_take` before it writes: one Lua script (one round trip, atomic) checks every item of the
call against the day's counters and counts the items that fit, in order, so concurrent accepts of any process
never take more than the limit. An item that would exceed a limit on one of its channels takes nothing and is
refused alone: 429 `quota_exceeded` naming the channel, with a wait until midnight UTC (Retry-After). What a
send counts is decided by the accept (docs/projects.md, "Daily quotas"); an environment without quotas on the
send's channels costs no Redis call at all.

The day is the clock's (`DailyQuotas.clock`, Django's `timezone.now` unless a test sets another), not Redis':
the counter of a day is its own key, which expires an hour after the day ends.

Redis unreachable: as the rate limiters (core.ratelimit), each process falls back to counting in memory
(core.redis_guard.RedisGuard: logged once, Redis retried after a short back-off). A process allows its share
of what was left when it last saw the counter, (limit - used) / RESILIENCE_ASSUMED_WORKERS, so an outage lets
the environment's processes together send about what remained, never the whole limit again. What a process
counted while Redis was down is not written back: after the outage the shared counter goes on from its value.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import redis
from django.conf import settings
from django.utils import timezone

from core.errors import ApiError
from core.ratelimit import assumed_workers
from core.redis_guard import RedisGuard, rkey
from projects.selectors import environment_settings

# Counters outlive their day by this much: a refund of a send accepted at 23:59:59 still finds its counter.
EXPIRE_AFTER_DAY_SECONDS = 3600

# KEYS: the counters asked about (one per limited channel). ARGV: the day's expiry (epoch seconds), then each
# key's limit, then per item one amount per key. An item is counted when every amount fits under its limit,
# else it takes nothing. Returns per item 0 (counted) or the 1-based index of the key it did not fit, then
# each key's count after the call.
TAKE_LUA = """
local nk = #KEYS
local used, limits, added = {}, {}, {}
for i = 1, nk do
  used[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
  limits[i] = tonumber(ARGV[1 + i])
  added[i] = 0
end
local out = {}
local items = (#ARGV - 1 - nk) / nk
for j = 0, items - 1 do
  local base = 1 + nk + j * nk
  local refused = 0
  for i = 1, nk do
    local n = tonumber(ARGV[base + i])
    if n > 0 and used[i] + n > limits[i] then
      refused = i
      break
    end
  end
  if refused == 0 then
    for i = 1, nk do
      local n = tonumber(ARGV[base + i])
      used[i] = used[i] + n
      added[i] = added[i] + n
    end
  end
  out[#out + 1] = refused
end
for i = 1, nk do
  if added[i] > 0 then
    redis.call('INCRBY', KEYS[i], added[i])
    redis.call('EXPIREAT', KEYS[i], tonumber(ARGV[1]))
  end
  out[#out + 1] = used[i]
end
return out
"""

# KEYS: counters; ARGV: the amount to give back to each. A counter that has expired (its day is over) is left alone.
REFUND_LUA = """
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('DECRBY', KEYS[i], tonumber(ARGV[i]))
  end
end
return 0
"""


def counter_key(environment_id: int, channel: str, day: date) -> str:
    """Return the Redis key of an environment's count of `channel` on `day` (UTC).

    Hash-tagged by environment, as the rate limiter's buckets are by provider: one script may touch every
    channel's counter of an environment even on a Redis Cluster.
    """
    return rkey("quota", "{%d}" % environment_id, channel, day.isoformat())  # noqa: UP031


def next_midnight(now: datetime) -> datetime:
    """Return the start of the UTC day after `now`: when the day's quotas reset."""
    day = now.astimezone(UTC).date()
    return datetime.combine(day + timedelta(days=1), time.min, tzinfo=UTC)


def quota_exceeded(channel: str, limit: int, resets_at: datetime, now: datetime) -> ApiError:
    """Return the 429 `quota_exceeded` of a send over `channel`'s daily limit, with its wait until the reset."""
    error = ApiError(
        429,
        "quota_exceeded",
        f"The daily quota of {limit} '{channel}' messages of this project environment is used up; "
        f"it resets at {resets_at.strftime('%Y-%m-%dT%H:%M:%SZ')}.",
        {"channel": [channel]},
    )
    # DRF's convention for "come back later": core.errors turns `wait` into Retry-After.
    error.wait = max(1.0, (resets_at - now).total_seconds())  # type: ignore[attr-defined]
    return error


@dataclass
class Taken:
    """What one `take` counted, to give back if the accept it was for is not written."""

    keys: dict[str, int] = field(default_factory=dict)
    degraded: bool = False


@dataclass(frozen=True)
class Usage:
    """One channel's quota of the day: its limit, what was counted, when it resets."""

    limit: int
    used: int
    resets_at: datetime


class DailyQuotas:
    """Daily counters per environment and channel in Redis; construct with a client (or factory) to point elsewhere."""

    def __init__(self, redis_client: redis.Redis | Callable[[], redis.Redis] | None = None) -> None:
        self.guard = RedisGuard("daily quotas", redis_client)
        # What "today" is; a test sets its own clock to cross midnight.
        self.clock: Callable[[], datetime] = timezone.now
        self._lock = threading.Lock()
        # Per process: the last count Redis answered per key, and what this process counted while Redis was down.
        self._seen: dict[str, int] = {}
        self._local: dict[str, int] = {}
        self._day: date | None = None

    def take(
        self, environment_id: int, limits: Mapping[str, int], items: Sequence[Mapping[str, int]]
    ) -> tuple[list[ApiError | None], Taken]:
        """Count each item's amounts per channel if all fit under `limits`; return per item None or its 429.

        `items` are counted in order: an item that does not fit takes nothing, and a later smaller one may
        still fit. Channels without a limit are not counted. Returns what was counted, for `refund`.
        """
        now = self.clock()
        resets_at = next_midnight(now)
        day = now.astimezone(UTC).date()
        channels = sorted({c for item in items for c, n in item.items() if n > 0 and c in limits})
        if not channels:
            return [None] * len(items), Taken()
        keys = [counter_key(environment_id, c, day) for c in channels]
        amounts = [[int(item.get(c, 0)) for c in channels] for item in items]
        caps = [int(limits[c]) for c in channels]
        expire_at = int(resets_at.timestamp()) + EXPIRE_AFTER_DAY_SECONDS

        def shared(client: redis.Redis) -> tuple[list[int], bool]:
            args: list[Any] = [expire_at, *caps, *(n for row in amounts for n in row)]
            answer = [int(v) for v in self.guard.script(client, TAKE_LUA)(keys=keys, args=args)]
            with self._lock:
                self._seen.update(zip(keys, answer[len(items) :], strict=True))
            return answer[: len(items)], False

        refused, degraded = self.guard.run(shared, lambda: (self._local_take(day, keys, caps, amounts), True))
        taken = Taken(degraded=degraded)
        results: list[ApiError | None] = []
        for row, index in zip(amounts, refused, strict=True):
            if index:
                channel = channels[index - 1]
                results.append(quota_exceeded(channel, caps[index - 1], resets_at, now))
                continue
            for key, n in zip(keys, row, strict=True):
                if n:
                    taken.keys[key] = taken.keys.get(key, 0) + n
            results.append(None)
        return results, taken

    def refund(self, taken: Taken) -> None:
        """Give back what `take` counted for accepts that were not written."""
        keys = [k for k, n in taken.keys.items() if n > 0]
        if not keys:
            return
        if taken.degraded:
            with self._lock:
                for key in keys:
                    if key in self._local:
                        self._local[key] = max(0, self._local[key] - taken.keys[key])
            return
        amounts = [taken.keys[k] for k in keys]
        self.guard.run(lambda client: self.guard.script(client, REFUND_LUA)(keys=keys, args=amounts), lambda: None)

    def usage(self, environment_id: int, limits: Mapping[str, int]) -> dict[str, Usage]:
        """Return each limited channel's limit, today's count and reset (with Redis down, this process's view)."""
        now = self.clock()
        resets_at = next_midnight(now)
        day = now.astimezone(UTC).date()
        channels = sorted(limits)
        keys = [counter_key(environment_id, c, day) for c in channels]

        def shared(client: redis.Redis) -> list[int]:
            return [int(v or 0) for v in client.mget(keys)] if keys else []

        def local() -> list[int]:
            with self._lock:
                self._new_day(day)
                return [self._local.get(k, self._seen.get(k, 0)) for k in keys]

        counts: list[int] = self.guard.run(shared, local)
        return {
            c: Usage(limit=int(limits[c]), used=n, resets_at=resets_at) for c, n in zip(channels, counts, strict=True)
        }

    # --- internals -----------------------------------------------------------------------------------

    def _new_day(self, day: date) -> None:
        """Forget the counts of earlier days (called with the lock held)."""
        if self._day != day:
            self._day = day
            suffix = ":" + day.isoformat()
            self._seen = {k: v for k, v in self._seen.items() if k.endswith(suffix)}
            self._local = {k: v for k, v in self._local.items() if k.endswith(suffix)}

    def _local_take(self, day: date, keys: list[str], caps: list[int], amounts: list[list[int]]) -> list[int]:
        """Count in this process while Redis is down: its share of what was left when it last saw each counter."""
        workers = assumed_workers()
        refused: list[int] = []
        with self._lock:
            self._new_day(day)
            for row in amounts:
                index = 0
                for i, (key, cap, n) in enumerate(zip(keys, caps, row, strict=True), start=1):
                    seen = self._seen.get(key, 0)
                    allowed = seen + max(0, cap - seen) // workers
                    if n > 0 and self._local.get(key, seen) + n > allowed:
                        index = i
                        break
                if not index:
                    for key, n in zip(keys, row, strict=True):
                        self._local[key] = self._local.get(key, self._seen.get(key, 0)) + n
                refused.append(index)
        return refused


daily = DailyQuotas()


def quotas_of(environment_id: int) -> Mapping[str, int]:
    """Return the daily limits per channel of an environment (cached per process: no query)."""
    found = environment_settings(environment_id)
    return found.quotas if found is not None else {}


def quota_take(environment_id: int, items: Sequence[Mapping[str, int]]) -> tuple[list[ApiError | None], Taken]:
    """Count the items' messages per channel against the environment's daily quotas (see DailyQuotas.take)."""
    limits = quotas_of(environment_id)
    if not limits:
        return [None] * len(items), Taken()
    return daily.take(environment_id, limits, items)


def quota_refund(taken: Taken) -> None:
    """Give back what `quota_take` counted for accepts that were not written."""
    daily.refund(taken)


def quota_usage(environment_id: int) -> dict[str, Usage]:
    """Return today's usage of each channel the environment limits."""
    return daily.usage(environment_id, quotas_of(environment_id))


def quotas_validate(value: Any) -> dict[str, int]:
    """Return quotas as stored ({"email": 10000}) or raise ValueError: known channels, whole numbers >= 0."""
    if value in (None, ""):
        return {}
    if not isinstance(value, dict):
        raise ValueError('Expected an object of daily limits per channel, such as {"email": 10000, "sms": 500}.')
    unknown = sorted(set(value) - set(settings.CHANNELS))
    if unknown:
        raise ValueError(f"Unknown channel(s): {', '.join(unknown)} (channels: {', '.join(settings.CHANNELS)}).")
    bad = sorted(k for k, v in value.items() if isinstance(v, bool) or not isinstance(v, int) or v < 0)
    if bad:
        raise ValueError(f"The limit of {', '.join(bad)} must be a whole number of messages per day, 0 or more.")
    return {str(k): int(v) for k, v in value.items()}
