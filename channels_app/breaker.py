"""Circuit breakers per provider, with their state in Redis so every worker sees the same breaker.

Interface for the send pipeline (no function raises on Redis errors):

    admission = admit(provider, n)   # -> Admission(allowed: int, retry_in: float, state: str)
        # closed: all n; open: 0 (defer the batch by `retry_in`); half-open: at most the probe slots left.
    allow(provider) -> bool          # admit(provider, 1).allowed == 1
    record(provider, ok=True|False, n=1)
        # Outcome of n calls that were admitted. ok=False for what says the provider is unwell: timeouts,
        # connection errors, 5xx. ok=True for successes and for permanent errors about the message (the
        # provider answered). Throttling is neither: report it to ratelimit.on_throttled instead.
    state(provider) -> "closed" | "open" | "half_open"
    on_state_change(callback)        # callback(provider, old_state, new_state), called in the process
                                     # that made the transition (for metrics); exceptions are logged.

States: closed → open when, over the sliding window (`bucket_seconds` buckets covering `window_seconds`), at
least `min_calls` calls were recorded and the failed fraction reached `failure_threshold`; open fails fast for
`cooldown_seconds`; then half-open lets `half_open_probes` calls through (taken atomically, so only that many
callers probe across all workers); that many successes close it, any failure re-opens it. Probes that never
report back (their worker died) are forgotten after another cooldown, so a half-open breaker cannot stick.

Settings: PROVIDER_CIRCUIT_BREAKERS = {"default": {...}, "<provider>": {...}} merged over DEFAULT_BREAKER;
env PROVIDER_CIRCUIT_BREAKERS (JSON) overrides. Redis down: each process keeps its own breaker (with
`min_calls` and `half_open_probes` divided by RESILIENCE_ASSUMED_WORKERS, at least 1) and logs once.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from django.conf import settings

from core import metrics
from core.ratelimit import assumed_workers
from core.redis_guard import RedisGuard, rkey

logger = logging.getLogger(__name__)

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

DEFAULT_BREAKER: dict[str, float] = {
    "window_seconds": 30,
    "bucket_seconds": 10,
    "min_calls": 20,
    "failure_threshold": 0.5,
    "cooldown_seconds": 30,
    "half_open_probes": 3,
}
KEY_TTL_SECONDS = 24 * 3600

StateListener = Callable[[str, str, str], None]
_listeners: list[StateListener] = []


def on_state_change(callback: StateListener) -> StateListener:
    """Register `callback(provider, old_state, new_state)`; usable as a decorator."""
    _listeners.append(callback)
    return callback


def _notify(provider: str, old: str, new: str) -> None:
    # Provider names only: nothing about recipients or messages reaches the log.
    log = logger.warning if new == OPEN else logger.info
    log("circuit breaker %s: %s -> %s", provider, old, new)
    for callback in list(_listeners):
        try:
            callback(provider, old, new)
        except Exception:
            logger.exception("circuit breaker listener failed")


@on_state_change
def _export_state(provider: str, _old: str, new: str) -> None:
    # Every transition made in this process becomes the `notifier_breaker_state` gauge (core.metrics).
    metrics.set_breaker_state(provider, new)


@dataclass(frozen=True)
class BreakerConfig:
    """The thresholds of one provider's breaker."""

    window_seconds: float
    bucket_seconds: float
    min_calls: int
    failure_threshold: float
    cooldown_seconds: float
    half_open_probes: int

    @property
    def buckets(self) -> int:
        """Return how many buckets the sliding window spans."""
        return max(1, math.ceil(self.window_seconds / self.bucket_seconds))


def config_for(provider: str) -> BreakerConfig:
    """Return the provider's breaker settings: module defaults, then "default", then the provider's own."""
    overrides = settings.PROVIDER_CIRCUIT_BREAKERS or {}
    conf = {**DEFAULT_BREAKER, **(overrides.get("default") or {}), **(overrides.get(provider) or {})}
    return BreakerConfig(
        window_seconds=float(_number(conf, "window_seconds")),
        bucket_seconds=max(0.001, float(_number(conf, "bucket_seconds"))),
        min_calls=max(1, int(_number(conf, "min_calls"))),
        failure_threshold=float(_number(conf, "failure_threshold")),
        cooldown_seconds=float(_number(conf, "cooldown_seconds")),
        half_open_probes=max(1, int(_number(conf, "half_open_probes"))),
    )


def _number(conf: dict[str, object], name: str) -> int | float | str:
    """Return a breaker setting in a form float() and int() take; the settings come from JSON, so check it."""
    value = conf[name]
    if isinstance(value, int | float | str):
        return value
    # The TypeError float() would raise, with the setting's name.
    raise TypeError(f"PROVIDER_CIRCUIT_BREAKERS {name}: expected a number, got {type(value).__name__}")


@dataclass(frozen=True)
class Admission:
    """The answer to `admit`: how many calls may go now, and when to try again if not all."""

    allowed: int
    retry_in: float
    state: str
    degraded: bool = False


def breaker_key(provider: str) -> str:
    """Return the Redis key of a provider's breaker."""
    return rkey("cb", provider)


# One hash per provider: st (state), until (end of the open cool-down), hs (half-open since), probes (probe
# slots handed out), okp (probe successes), and window counters c:<bucket> (calls) and f:<bucket> (failures).

# ARGV: n, cooldown, probes. Returns {allowed, retry_in (string), old state, new state}.
ADMIT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n = tonumber(ARGV[1])
local cooldown = tonumber(ARGV[2])
local maxprobes = tonumber(ARGV[3])
local h = redis.call('HMGET', KEYS[1], 'st', 'until', 'hs', 'probes')
local st = h[1] or 'closed'
local old = st
if st == 'closed' then return {n, '0', old, st} end
if st == 'open' then
  local untl = tonumber(h[2]) or 0
  if now < untl then return {0, tostring(untl - now), old, st} end
  st = 'half_open'
  redis.call('HSET', KEYS[1], 'st', st, 'hs', string.format('%.6f', now), 'probes', '0', 'okp', '0')
  h[3] = now
  h[4] = '0'
end
local probes = tonumber(h[4]) or 0
-- Probes handed out but never reported (their worker died) are forgotten after a cool-down.
if now - (tonumber(h[3]) or now) > cooldown and probes >= maxprobes then
  probes = 0
  redis.call('HSET', KEYS[1], 'hs', string.format('%.6f', now), 'probes', '0', 'okp', '0')
end
local allowed = math.min(n, maxprobes - probes)
if allowed < 0 then allowed = 0 end
if allowed > 0 then redis.call('HINCRBY', KEYS[1], 'probes', allowed) end
local retry = '0'
if allowed < n then retry = tostring(math.max(1, cooldown / 10)) end
return {allowed, retry, old, st}
"""

# ARGV: ok (1/0), n, bucket seconds, buckets, min calls, threshold, cooldown, probes, ttl.
# Returns {old state, new state}.
RECORD_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ok = ARGV[1] == '1'
local n = tonumber(ARGV[2])
local bsec = tonumber(ARGV[3])
local nb = tonumber(ARGV[4])
local mincalls = tonumber(ARGV[5])
local threshold = tonumber(ARGV[6])
local cooldown = tonumber(ARGV[7])
local maxprobes = tonumber(ARGV[8])
local st = redis.call('HGET', KEYS[1], 'st') or 'closed'
local old = st
local function clear_window()
  local fields = redis.call('HKEYS', KEYS[1])
  for _, f in ipairs(fields) do
    local p = string.sub(f, 1, 2)
    if p == 'c:' or p == 'f:' then redis.call('HDEL', KEYS[1], f) end
  end
end
local function open()
  clear_window()
  redis.call('HSET', KEYS[1], 'st', 'open', 'until', string.format('%.6f', now + cooldown), 'probes', '0', 'okp', '0')
  st = 'open'
end
if st == 'half_open' then
  if not ok then
    open()
  else
    local okp = redis.call('HINCRBY', KEYS[1], 'okp', n)
    if okp >= maxprobes then
      clear_window()
      redis.call('HSET', KEYS[1], 'st', 'closed', 'probes', '0', 'okp', '0')
      st = 'closed'
    end
  end
elseif st == 'closed' then
  local b = math.floor(now / bsec)
  redis.call('HINCRBY', KEYS[1], 'c:' .. b, n)
  if not ok then redis.call('HINCRBY', KEYS[1], 'f:' .. b, n) end
  local calls, fails = 0, 0
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local f = all[i]
    local p = string.sub(f, 1, 2)
    if p == 'c:' or p == 'f:' then
      local fb = tonumber(string.sub(f, 3))
      if fb <= b - nb then
        redis.call('HDEL', KEYS[1], f)
      elseif p == 'c:' then
        calls = calls + tonumber(all[i + 1])
      else
        fails = fails + tonumber(all[i + 1])
      end
    end
  end
  if calls >= mincalls and fails >= threshold * calls then open() end
end
-- An open breaker ignores late outcomes of calls admitted before it opened.
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[9]))
return {old, st}
"""


@dataclass
class _LocalBreaker:
    """One process's breaker while Redis is down: the same state machine, in memory."""

    state: str = CLOSED
    until: float = 0.0
    half_open_since: float = 0.0
    probes: int = 0
    probe_ok: int = 0
    window: dict[int, list[int]] = field(default_factory=dict)  # bucket -> [calls, failures]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class CircuitBreakers:
    """Every provider's breaker; construct with a Redis client (or factory) to point it elsewhere."""

    def __init__(self, redis_client: redis.Redis | Callable[[], redis.Redis] | None = None) -> None:
        self.guard = RedisGuard("circuit breaker", redis_client)
        self._scripts: dict[tuple[int, str], redis.commands.core.Script] = {}
        self._local: dict[str, _LocalBreaker] = {}
        self._lock = threading.Lock()

    def admit(self, provider: str, n: int = 1) -> Admission:
        """Return how many of `n` calls to `provider` may be made now."""
        conf = config_for(provider)

        def shared(client: redis.Redis) -> Admission:
            allowed, retry, old, new = self._script(client, ADMIT_LUA)(
                keys=[breaker_key(provider)], args=[n, conf.cooldown_seconds, conf.half_open_probes]
            )
            old, new = _text(old), _text(new)
            if old != new:
                _notify(provider, old, new)
            return Admission(allowed=int(allowed), retry_in=float(retry), state=new)

        # RedisGuard.run returns what either callable returns; both give an Admission.
        admission: Admission = self.guard.run(shared, lambda: self._local_admit(provider, n, conf))
        return admission

    def allow(self, provider: str) -> bool:
        """Return whether one call to `provider` may be made now."""
        return self.admit(provider, 1).allowed == 1

    def record(self, provider: str, *, ok: bool, n: int = 1) -> None:
        """Record the outcome of `n` admitted calls to `provider`."""
        if n <= 0:
            return
        conf = config_for(provider)
        args = [
            1 if ok else 0,
            n,
            conf.bucket_seconds,
            conf.buckets,
            conf.min_calls,
            conf.failure_threshold,
            conf.cooldown_seconds,
            conf.half_open_probes,
            KEY_TTL_SECONDS,
        ]

        def shared(client: redis.Redis) -> None:
            old, new = self._script(client, RECORD_LUA)(keys=[breaker_key(provider)], args=args)
            old, new = _text(old), _text(new)
            if old != new:
                _notify(provider, old, new)

        self.guard.run(shared, lambda: self._local_record(provider, ok, n, conf))

    def state(self, provider: str) -> str:
        """Return the breaker's stored state: "closed", "open" or "half_open"."""

        def shared(client: redis.Redis) -> str:
            value = client.hget(breaker_key(provider), "st")
            return _text(value) if value is not None else CLOSED

        stored: str = self.guard.run(shared, lambda: self._local_breaker(provider).state)
        return stored

    def reset(self, provider: str) -> None:
        """Close the breaker and forget its window (an operator's action, also used by tests)."""
        self.guard.run(lambda client: client.delete(breaker_key(provider)), lambda: self._local.pop(provider, None))

    # --- internals -----------------------------------------------------------------------------------

    def _script(self, client: redis.Redis, source: str) -> redis.commands.core.Script:
        cache_key = (id(client), source)
        script = self._scripts.get(cache_key)
        if script is None:
            script = self._scripts[cache_key] = client.register_script(source)
        return script

    def _local_breaker(self, provider: str) -> _LocalBreaker:
        breaker = self._local.get(provider)
        if breaker is None:
            breaker = self._local[provider] = _LocalBreaker()
        return breaker

    @staticmethod
    def _local_share(value: int) -> int:
        return max(1, value // assumed_workers())

    def _local_admit(self, provider: str, n: int, conf: BreakerConfig) -> Admission:
        now = time.monotonic()
        changes: list[tuple[str, str]] = []
        with self._lock:
            b = self._local_breaker(provider)
            if b.state == CLOSED:
                return Admission(allowed=n, retry_in=0.0, state=CLOSED, degraded=True)
            if b.state == OPEN:
                if now < b.until:
                    return Admission(allowed=0, retry_in=b.until - now, state=OPEN, degraded=True)
                changes.append((OPEN, HALF_OPEN))
                b.state, b.half_open_since, b.probes, b.probe_ok = HALF_OPEN, now, 0, 0
            max_probes = self._local_share(conf.half_open_probes)
            if now - b.half_open_since > conf.cooldown_seconds and b.probes >= max_probes:
                b.half_open_since, b.probes, b.probe_ok = now, 0, 0
            allowed = max(0, min(n, max_probes - b.probes))
            b.probes += allowed
        for old, new in changes:
            _notify(provider, old, new)
        retry = 0.0 if allowed == n else max(1.0, conf.cooldown_seconds / 10)
        return Admission(allowed=allowed, retry_in=retry, state=HALF_OPEN, degraded=True)

    def _local_record(self, provider: str, ok: bool, n: int, conf: BreakerConfig) -> None:
        now = time.monotonic()
        with self._lock:
            b = self._local_breaker(provider)
            old = b.state
            if b.state == HALF_OPEN:
                if not ok:
                    b.state, b.until, b.window = OPEN, now + conf.cooldown_seconds, {}
                else:
                    b.probe_ok += n
                    if b.probe_ok >= self._local_share(conf.half_open_probes):
                        b.state, b.window = CLOSED, {}
            elif b.state == CLOSED:
                current = math.floor(now / conf.bucket_seconds)
                counts = b.window.setdefault(current, [0, 0])
                counts[0] += n
                counts[1] += 0 if ok else n
                for bucket in [k for k in b.window if k <= current - conf.buckets]:
                    del b.window[bucket]
                calls = sum(c for c, _ in b.window.values())
                fails = sum(f for _, f in b.window.values())
                if calls >= self._local_share(conf.min_calls) and fails >= conf.failure_threshold * calls:
                    b.state, b.until, b.window = OPEN, now + conf.cooldown_seconds, {}
            new = b.state
        if old != new:
            _notify(provider, old, new)


_default = CircuitBreakers()


def admit(provider: str, n: int = 1) -> Admission:
    """Return how many of `n` calls to `provider` may go now (see the module docstring)."""
    return _default.admit(provider, n)


def allow(provider: str) -> bool:
    """Return whether one call to `provider` may go now."""
    return _default.allow(provider)


def record(provider: str, *, ok: bool, n: int = 1) -> None:
    """Record the outcome of `n` admitted calls to `provider`."""
    _default.record(provider, ok=ok, n=n)


def state(provider: str) -> str:
    """Return the provider's breaker state."""
    return _default.state(provider)
