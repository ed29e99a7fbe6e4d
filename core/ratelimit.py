"""Shared per-provider rate limits: token buckets in Redis with a high-priority reserve and AIMD.

Interface for the send pipeline (all functions are safe to call from any worker; none raises on Redis errors):

    grant = acquire(provider, n, priority="high" | "normal" | "low", account=None)
        # -> Grant(granted: int, wait: float, degraded: bool)
        # Send `grant.granted` messages now; defer the other n - granted by at least `grant.wait` seconds.
    on_throttled(provider, retry_after=None, account=None)
        # The provider answered "slow down" (429 & co): halve the shared rate (once per cut window, with a
        # floor) and pause the bucket until Retry-After. Call it once per batch, with the largest Retry-After.
    on_success(provider, n, account=None)
        # n messages went through: grow the rate back additively towards the configured rate.
    snapshot(provider, account=None) -> dict   # tokens, current and configured rate, pause left (for admin/metrics)

Semantics:
- One bucket per key: the provider, plus one per sender account (number, domain) when the provider's config has
  `per_account` or `accounts`; with an account, a grant takes from both buckets atomically (min of the two).
- Priority reserve: `high_reserve` (a fraction of the burst) of each bucket may only be taken by high priority.
  Low (and normal) priority take tokens only while the bucket holds more than the reserve, so a marketing flood
  drains the bucket down to the reserve and stops there; an OTP still finds tokens, and since low cannot take
  anything while high keeps the bucket below the reserve, high gets the whole rate when it needs it.
- All of it is one Lua script per call (EVALSHA via `register_script`), using Redis' clock, so every worker on
  every host shares one bucket and one clock.
- Redis unreachable: each process falls back to in-memory buckets with rate and burst divided by
  `RESILIENCE_ASSUMED_WORKERS`, logs once, and retries Redis after a short back-off.

Settings (see docs/resilience.md):
    PROVIDER_RATE_LIMITS = {"<provider>": {"rate": per second, "burst": tokens, "high_reserve": fraction,
                            "min_rate": floor of AIMD, "increase": rate added per success,
                            "per_account": {...same keys...}, "accounts": {"<account>": {...}}}}
    (merged over DEFAULT_LIMITS below; "rate": null means unlimited; the key "default" applies to unknown
    providers), env PROVIDER_RATE_LIMITS (JSON) overrides; RESILIENCE_ASSUMED_WORKERS (int, default 4).
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from django.conf import settings
from django.core.exceptions import ValidationError

from core.redis_guard import RedisGuard, rkey

T = TypeVar("T")

logger = logging.getLogger(__name__)

# Sensible starting points, overridden per deployment. Real providers publish their own quotas: SES starts
# accounts at 14 messages/s, SNS SMS at 20/s, a Twilio long code at 1/s (messaging services more), FCM allows
# 600k/min per project. The sandbox and the in-app inbox (our own database) are effectively unlimited, but the
# sandbox still goes through the limiter so throttling tests exercise the real path.
DEFAULT_LIMITS: dict[str, dict[str, Any]] = {
    "default": {"rate": 50.0, "burst": 50.0, "high_reserve": 0.2},
    "sandbox": {"rate": 100_000.0, "burst": 100_000.0, "high_reserve": 0.1},
    "inapp": {"rate": None},
    "fcm": {"rate": 5_000.0, "burst": 5_000.0, "high_reserve": 0.2},
    "ses": {"rate": 14.0, "burst": 14.0, "high_reserve": 0.3},
    "smtp": {"rate": 50.0, "burst": 50.0, "high_reserve": 0.3},
    "twilio": {"rate": 100.0, "burst": 100.0, "high_reserve": 0.3},
    "sns": {"rate": 20.0, "burst": 20.0, "high_reserve": 0.3},
    "webhook": {"rate": 500.0, "burst": 500.0, "high_reserve": 0.2},
    # Chat: Slack allows about one message per second per conversation with bursts (20/s across them is a safe
    # start), a Teams or Discord webhook a few per second each, the Telegram Bot API 30/s, Twilio's WhatsApp
    # senders 80/s.
    "slack": {"rate": 20.0, "burst": 20.0, "high_reserve": 0.3},
    "teams": {"rate": 20.0, "burst": 20.0, "high_reserve": 0.3},
    "discord": {"rate": 30.0, "burst": 30.0, "high_reserve": 0.3},
    "telegram": {"rate": 30.0, "burst": 30.0, "high_reserve": 0.3},
    "twilio_whatsapp": {"rate": 80.0, "burst": 80.0, "high_reserve": 0.3},
}
# Fraction of the configured rate AIMD never cuts below, unless "min_rate" is given.
DEFAULT_MIN_RATE_FRACTION = 0.05
# Rate (per second) added back per successful send. Scale-free: at a rate r about r successes arrive per
# second, so recovery from half to full rate takes roughly 0.5 / (0.75 * 0.02) ≈ 33 s at any rate.
DEFAULT_INCREASE = 0.02
# Throttled answers from one burst arrive together (a batch of 500 may yield 100 of them): the rate is cut at
# most once per this many seconds, like TCP cutting once per round trip; later ones only extend the pause.
CUT_WINDOW_SECONDS = 1.0
# Keys expire when idle: a bucket left alone refills to full anyway, and an AIMD cut forgotten after an hour
# of silence is the right thing.
KEY_TTL_SECONDS = 3600

PRIORITY_HIGH = "high"


# A rate as the API's limits are written: "200/s", "1000/m", "50000/h" (the API clients', projects' and inbox tokens').
RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$", re.IGNORECASE)
PERIOD_SECONDS = {"s": 1, "m": 60, "h": 3600}


def parse_rate(text: str) -> tuple[float, float]:
    """Parse "200/s", "1000/m" or "50000/h" into (tokens per second, burst); raise ValueError otherwise."""
    match = RATE.match(text or "")
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"'{text}' is not a rate such as 200/s, 1000/m or 50000/h")
    count = float(match.group(1))
    return count / PERIOD_SECONDS[match.group(2)[0].lower()], max(count, 1.0)


def clean_rate_text(value: str | None) -> str:
    """Return a form's rate as stored (stripped; empty: none), or raise the form's ValidationError for a non-rate."""
    text = (value or "").strip()
    if text:
        try:
            parse_rate(text)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
    return text


@dataclass(frozen=True)
class Limit:
    """The configured limit of one bucket; `rate` None means unlimited."""

    rate: float | None
    burst: float
    high_reserve: float
    min_rate: float
    increase: float

    @property
    def reserve_tokens(self) -> float:
        """Return the tokens only high priority may take."""
        return self.high_reserve * self.burst

    @property
    def capacity(self) -> float:
        """Return the bucket size: at least one token above the reserve, so low priority can never starve."""
        return max(self.burst, self.reserve_tokens + 1.0)


@dataclass(frozen=True)
class Grant:
    """The answer to `acquire`: how many tokens were taken and how long until the next one is due."""

    granted: int
    wait: float
    degraded: bool = False
    # The value of the key `acquire_buckets` was asked to read along (None: absent, or Redis did not answer).
    value: str | None = None


def configured_limits() -> dict[str, dict[str, Any]]:
    """Return the per-provider limits: module defaults, then settings.PROVIDER_RATE_LIMITS (JSON in the environment)."""
    merged: dict[str, dict[str, Any]] = {name: dict(conf) for name, conf in DEFAULT_LIMITS.items()}
    for name, conf in (settings.PROVIDER_RATE_LIMITS or {}).items():
        merged[name] = {**merged.get(name, {}), **conf}
    return merged


def _to_limit(conf: dict[str, Any], parent: Limit | None = None) -> Limit:
    rate = conf.get("rate", parent.rate if parent else None)
    if rate is not None:
        rate = float(rate)
        if rate <= 0:
            rate = None
    burst = float(conf.get("burst") or (rate if rate else 1.0))
    high_reserve = float(conf.get("high_reserve", parent.high_reserve if parent else 0.0))
    high_reserve = min(max(high_reserve, 0.0), 0.95)
    min_rate = conf.get("min_rate")
    floor = float(min_rate) if min_rate is not None else (rate or 0.0) * DEFAULT_MIN_RATE_FRACTION
    if rate is not None:
        floor = min(max(floor, 1e-3), rate)
    increase = float(conf.get("increase", parent.increase if parent else DEFAULT_INCREASE))
    return Limit(rate=rate, burst=max(burst, 1.0), high_reserve=high_reserve, min_rate=floor, increase=increase)


def limit_for(provider: str, account: str | None = None) -> tuple[Limit, Limit | None]:
    """Return the provider's limit and, if one is configured for `account`, the account's limit."""
    limits = configured_limits()
    conf = limits.get(provider, limits["default"])
    provider_limit = _to_limit(conf)
    if account is None:
        return provider_limit, None
    account_conf = (conf.get("accounts") or {}).get(account) or conf.get("per_account")
    if not account_conf:
        return provider_limit, None
    # An account inherits the provider's reserve and AIMD step unless it sets its own.
    return provider_limit, _to_limit(account_conf, parent=provider_limit)


def assumed_workers() -> int:
    """Return how many processes share a provider's limit when each must enforce its own share."""
    return max(1, int(settings.RESILIENCE_ASSUMED_WORKERS or 4))


def bucket_key(provider: str, account: str | None = None) -> str:
    """Return the Redis key of a bucket (hash-tagged by provider, so one script may touch both buckets)."""
    return rkey("rl", "{%s}" % provider, *(("acct", account) if account is not None else ()))  # noqa: UP031


# KEYS: bucket keys (provider, then the account's if any), and after them optionally one plain key whose value is
# read along (the API's configuration generation: one round trip for both). ARGV: n, is_high (1/0), ttl, then per
# bucket rate, capacity, reserve. Tokens and the refill clock live in one hash per key: tok, ts, and the AIMD state
# rate (absent = configured) and cut (time of the last cut). A `ts` in the future is a pause (Retry-After):
# nothing refills before it. Returns {granted, wait as a string (Lua numbers would be truncated to integers), the
# value read or false, one character per bucket: '1' where its rate is cut below the configured one, else '0'}.
# Times are written with string.format('%.6f'): tostring keeps 14 digits, too few for epoch microseconds.
ACQUIRE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n = tonumber(ARGV[1])
local high = ARGV[2] == '1'
local ttl = tonumber(ARGV[3])
local nb = (#ARGV - 3) / 3
local granted = n
local st = {}
local cut = ''
for i = 1, nb do
  local base = 3 + (i - 1) * 3
  local maxrate = tonumber(ARGV[base + 1])
  local cap = tonumber(ARGV[base + 2])
  local reserve = tonumber(ARGV[base + 3])
  local h = redis.call('HMGET', KEYS[i], 'tok', 'ts', 'rate')
  if h[3] then cut = cut .. '1' else cut = cut .. '0' end
  local rate = tonumber(h[3]) or maxrate
  if rate > maxrate then rate = maxrate end
  local tok = tonumber(h[1]) or cap
  local ts = tonumber(h[2]) or now
  if now > ts then
    tok = math.min(cap, tok + (now - ts) * rate)
    ts = now
  end
  local usable = tok
  if not high then usable = tok - reserve end
  local can = math.floor(usable + 1e-9)
  if can < 0 then can = 0 end
  if can < granted then granted = can end
  st[i] = {tok = tok, ts = ts, rate = rate, reserve = reserve}
end
local wait = 0
for i = 1, nb do
  local s = st[i]
  local tok = s.tok - granted
  redis.call('HSET', KEYS[i], 'tok', string.format('%.6f', tok), 'ts', string.format('%.6f', s.ts))
  redis.call('EXPIRE', KEYS[i], ttl)
  local need = 1 - tok
  if not high then need = s.reserve + 1 - tok end
  local w = 0
  if need > 0 then w = need / s.rate end
  if s.ts > now then w = w + (s.ts - now) end
  if w > wait then wait = w end
end
local value = false
if #KEYS > nb then value = redis.call('GET', KEYS[nb + 1]) end
return {granted, tostring(wait), value, cut}
"""

# KEYS[1]: one bucket. ARGV: configured rate, min rate, retry_after (seconds, 0 if none), cut window, ttl.
# Halves the rate at most once per cut window, empties the bucket, and pauses it until Retry-After.
# Returns the new rate as a string.
THROTTLED_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local maxrate = tonumber(ARGV[1])
local minrate = tonumber(ARGV[2])
local retry_after = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local h = redis.call('HMGET', KEYS[1], 'rate', 'cut', 'ts')
local rate = tonumber(h[1]) or maxrate
if rate > maxrate then rate = maxrate end
local cut = tonumber(h[2]) or 0
if now - cut >= window then
  rate = math.max(minrate, rate * 0.5)
  redis.call('HSET', KEYS[1], 'rate', tostring(rate), 'cut', string.format('%.6f', now))
end
local ts = math.max(tonumber(h[3]) or now, now + retry_after)
redis.call('HSET', KEYS[1], 'tok', '0', 'ts', string.format('%.6f', ts))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
return tostring(rate)
"""

# KEYS[1]: one bucket. ARGV: configured rate, n successes, increase per success. Grows the rate additively;
# at the configured rate the field is removed, so the common case writes nothing.
SUCCESS_LUA = """
local r = redis.call('HGET', KEYS[1], 'rate')
if not r then return ARGV[1] end
local maxrate = tonumber(ARGV[1])
local rate = tonumber(r) + tonumber(ARGV[2]) * tonumber(ARGV[3])
if rate >= maxrate then
  redis.call('HDEL', KEYS[1], 'rate')
  return ARGV[1]
end
redis.call('HSET', KEYS[1], 'rate', tostring(rate))
return tostring(rate)
"""


class _LocalBucket:
    """An in-memory bucket with the same rules as the Lua script, for one process while Redis is down."""

    def __init__(self, capacity: float) -> None:
        self.tokens = capacity
        self.ts = time.monotonic()
        self.rate: float | None = None  # None: the configured rate
        self.cut = -math.inf


class RateLimiter:
    """Token buckets shared through Redis; construct with a client (or factory) to point it elsewhere."""

    def __init__(self, redis_client: redis.Redis | Callable[[], redis.Redis] | None = None) -> None:
        self.guard = RedisGuard("rate limiter", redis_client)
        self._scripts: dict[tuple[int, str], redis.commands.core.Script] = {}
        self._local: dict[str, _LocalBucket] = {}
        self._local_lock = threading.Lock()
        # Buckets this process last saw at their configured rate (the acquire script says, per bucket): a success
        # reported to one of them would write nothing, so it is not sent (one round trip less per send batch).
        # A cut made meanwhile by another process is seen at this process's next acquire; until then its
        # successes grow the rate back a batch later than they would have.
        self._at_full: dict[str, bool] = {}

    # --- public API ----------------------------------------------------------------------------------

    def acquire(self, provider: str, n: int = 1, *, priority: str = PRIORITY_HIGH, account: str | None = None) -> Grant:
        """Take up to `n` tokens for `provider` (and `account`); return how many were granted and the wait."""
        if n < 0:
            raise ValueError("n must be >= 0")
        provider_limit, account_limit = limit_for(provider, account)
        buckets = [(bucket_key(provider), provider_limit)]
        if account_limit is not None:
            buckets.append((bucket_key(provider, account), account_limit))
        return self.acquire_buckets(buckets, n, high=priority == PRIORITY_HIGH)

    def acquire_buckets(
        self, buckets: list[tuple[str, Limit]], n: int = 1, *, high: bool = True, read_along: str | None = None
    ) -> Grant:
        """Take up to `n` tokens from every bucket at once (keys and limits given; the API client limit uses it).

        `read_along` names a plain key whose value comes back in the grant (`value`), read in the same round trip.
        """
        buckets = [(key, limit) for key, limit in buckets if limit.rate is not None]
        if (not buckets and read_along is None) or n == 0:
            return Grant(granted=n, wait=0.0)

        def shared(client: redis.Redis) -> Grant:
            args: list[Any] = [n, 1 if high else 0, KEY_TTL_SECONDS]
            for _, limit in buckets:
                args += [limit.rate, limit.capacity, limit.reserve_tokens]
            keys = [k for k, _ in buckets] + ([read_along] if read_along is not None else [])
            granted, wait, value, cut = self._script(client, ACQUIRE_LUA)(keys=keys, args=args)
            text = value.decode() if isinstance(value, bytes) else (None if value in (None, False, 0) else str(value))
            for (key, _), flag in zip(buckets, cut.decode() if isinstance(cut, bytes) else str(cut), strict=True):
                self._at_full[key] = flag == "0"
            return Grant(granted=int(granted), wait=float(wait), value=text)

        # RedisGuard.run returns what either callable returns; both give a Grant.
        grant: Grant = self.guard.run(shared, lambda: self._local_acquire(buckets, n, high))
        return grant

    def on_throttled(self, provider: str, retry_after: float | None = None, *, account: str | None = None) -> None:
        """Cut the shared rate of the throttled bucket and pause it until `retry_after` seconds from now."""
        key, limit = self._bucket(provider, account)
        if limit.rate is None:
            return
        pause = max(0.0, float(retry_after or 0.0))
        args = [limit.rate, limit.min_rate, pause, CUT_WINDOW_SECONDS, max(KEY_TTL_SECONDS, int(pause) + 60)]
        self._at_full[key] = False

        def shared(client: redis.Redis) -> None:
            new_rate = float(self._script(client, THROTTLED_LUA)(keys=[key], args=args))
            logger.info("rate limit %s: throttled, rate now %.3g/s of %.3g/s", provider, new_rate, limit.rate)

        self.guard.run(shared, lambda: self._local_throttled(key, limit, pause))

    def on_success(self, provider: str, n: int = 1, *, account: str | None = None) -> None:
        """Grow the rate of the bucket back by `n` successes' worth, up to the configured rate."""
        key, limit = self._bucket(provider, account)
        if limit.rate is None or n <= 0 or self._at_full.get(key):
            return
        configured_rate = limit.rate  # narrowed to float here; the closure below does not see the check

        def shared(client: redis.Redis) -> None:
            rate = float(self._script(client, SUCCESS_LUA)(keys=[key], args=[configured_rate, n, limit.increase]))
            self._at_full[key] = rate >= configured_rate

        self.guard.run(shared, lambda: self._local_success(key, limit, n))

    def snapshot(self, provider: str, account: str | None = None) -> dict[str, Any]:
        """Return the bucket's state for operators: tokens, rates and pause left (seconds)."""
        key, limit = self._bucket(provider, account)
        if limit.rate is None:
            return {"provider": provider, "rate": None, "configured_rate": None, "tokens": None, "paused_for": 0.0}
        configured_rate = limit.rate  # narrowed to float here; the closure below does not see the check

        def shared(client: redis.Redis) -> dict[str, Any]:
            pipe = client.pipeline(transaction=False)
            pipe.hmget(key, "tok", "ts", "rate")
            pipe.time()
            (tok, ts, rate), (sec, usec) = pipe.execute()
            now = sec + usec / 1e6
            current = min(float(rate), configured_rate) if rate is not None else configured_rate
            tokens = limit.capacity if tok is None else float(tok)
            if ts is not None and now > float(ts):
                tokens = min(limit.capacity, tokens + (now - float(ts)) * current)
            paused = max(0.0, float(ts) - now) if ts is not None else 0.0
            return {"rate": current, "tokens": tokens, "paused_for": paused, "degraded": False}

        def local() -> dict[str, Any]:
            bucket = self._local_bucket(key, limit)
            share = self._local_limit(limit)
            return {
                "rate": bucket.rate or share.rate,
                "tokens": bucket.tokens,
                "paused_for": max(0.0, bucket.ts - time.monotonic()),
                "degraded": True,
            }

        state = self.guard.run(shared, local)
        return {"provider": provider, "account": account, "configured_rate": limit.rate, **state}

    # --- internals -----------------------------------------------------------------------------------

    def _bucket(self, provider: str, account: str | None) -> tuple[str, Limit]:
        provider_limit, account_limit = limit_for(provider, account)
        if account_limit is not None:
            return bucket_key(provider, account), account_limit
        return bucket_key(provider), provider_limit

    def _script(self, client: redis.Redis, source: str) -> redis.commands.core.Script:
        # One Script object per client and source: it hashes once and reloads itself after a NOSCRIPT.
        cache_key = (id(client), source)
        script = self._scripts.get(cache_key)
        if script is None:
            script = self._scripts[cache_key] = client.register_script(source)
        return script

    @staticmethod
    def _local_limit(limit: Limit) -> Limit:
        """Return this process's share of a limit while every process enforces its own."""
        workers = assumed_workers()
        assert limit.rate is not None
        return Limit(
            rate=limit.rate / workers,
            burst=max(1.0, limit.burst / workers),
            high_reserve=limit.high_reserve,
            min_rate=limit.min_rate / workers,
            increase=limit.increase,
        )

    def _local_bucket(self, key: str, limit: Limit) -> _LocalBucket:
        bucket = self._local.get(key)
        if bucket is None:
            bucket = self._local[key] = _LocalBucket(self._local_limit(limit).capacity)
        return bucket

    def _local_acquire(self, buckets: list[tuple[str, Limit]], n: int, high: bool) -> Grant:
        now = time.monotonic()
        with self._local_lock:
            states = []
            granted = n
            for key, limit in buckets:
                share = self._local_limit(limit)
                assert share.rate is not None
                bucket = self._local_bucket(key, limit)
                rate = min(bucket.rate or share.rate, share.rate)
                if now > bucket.ts:
                    bucket.tokens = min(share.capacity, bucket.tokens + (now - bucket.ts) * rate)
                    bucket.ts = now
                usable = bucket.tokens - (0.0 if high else share.reserve_tokens)
                granted = min(granted, max(0, math.floor(usable + 1e-9)))
                states.append((bucket, share, rate))
            wait = 0.0
            for bucket, share, rate in states:
                bucket.tokens -= granted
                need = (1.0 if high else share.reserve_tokens + 1.0) - bucket.tokens
                w = (need / rate if need > 0 else 0.0) + max(0.0, bucket.ts - now)
                wait = max(wait, w)
        return Grant(granted=granted, wait=wait, degraded=True)

    def _local_throttled(self, key: str, limit: Limit, pause: float) -> None:
        share = self._local_limit(limit)
        assert share.rate is not None
        now = time.monotonic()
        with self._local_lock:
            bucket = self._local_bucket(key, limit)
            if now - bucket.cut >= CUT_WINDOW_SECONDS:
                bucket.rate = max(share.min_rate, (bucket.rate or share.rate) * 0.5)
                bucket.cut = now
            bucket.tokens = 0.0
            bucket.ts = max(bucket.ts, now + pause)

    def _local_success(self, key: str, limit: Limit, n: int) -> None:
        share = self._local_limit(limit)
        assert share.rate is not None
        with self._local_lock:
            bucket = self._local_bucket(key, limit)
            if bucket.rate is not None:
                # The additive step is per process here: each process sees only its own successes.
                bucket.rate = bucket.rate + n * share.increase
                if bucket.rate >= share.rate:
                    bucket.rate = None


_default = RateLimiter()


def acquire(provider: str, n: int = 1, *, priority: str = PRIORITY_HIGH, account: str | None = None) -> Grant:
    """Take up to `n` tokens from the shared limiter (see the module docstring)."""
    return _default.acquire(provider, n, priority=priority, account=account)


def on_throttled(provider: str, retry_after: float | None = None, *, account: str | None = None) -> None:
    """Report a throttled answer to the shared limiter (see the module docstring)."""
    _default.on_throttled(provider, retry_after, account=account)


def on_success(provider: str, n: int = 1, *, account: str | None = None) -> None:
    """Report `n` successful sends to the shared limiter (see the module docstring)."""
    _default.on_success(provider, n, account=account)


def snapshot(provider: str, account: str | None = None) -> dict[str, Any]:
    """Return the state of a bucket of the shared limiter."""
    return _default.snapshot(provider, account)
