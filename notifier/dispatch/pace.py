"""The pace at which topic fan-outs may fill the high queues, per channel, shared by every fan-out worker.

A topic notification at high priority (a transactional template to a whole topic) would otherwise put all of
its deliveries into `<channel>.high` at once, and an OTP published a moment later would wait behind them.
Fan-out therefore reserves **send seconds** before it publishes into a high queue: at most
`FANOUT_HIGH_PACE[channel]` deliveries per second of the broker's delayed delivery, over every fan-out (lanes,
topics, workers and hosts) together. A reservation of n deliveries fills the current second up to the pace, then
the next, and so on, and returns `[(countdown seconds, count), …]`; the caller publishes each part with that
countdown (RabbitMQ native delayed delivery: no worker sleeps). The state is one Redis hash per channel, the
"frontier" (the last second with reservations and how many it holds), changed by one Lua script on Redis'
clock, so two fan-out processes never hand out the same second twice.

`FANOUT_HIGH_PACE` is `channel=rate` pairs separated by `;`, with `*` for every other channel and 0 for
unpaced: the default `*=500;inapp=10000` keeps in-app (our own database, no provider on the far side) fast
enough that a 10,000-subscriber topic is published within a second, while push, email, SMS and webhooks leave
room in the high workers for the OTPs that arrive meanwhile. The pace only concerns the high queues: low and
normal priority travel on the low queues, which have their own workers (and campaigns their own rate cap).

Redis unreachable: each process keeps its own frontier with the pace divided by `RESILIENCE_ASSUMED_WORKERS`
(as the provider limits do), so the sum over the fan-out processes still stays near the pace.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from django.conf import settings

from core.redis_guard import RedisGuard, rkey

logger = logging.getLogger(__name__)

DEFAULT_PACE = "*=500;inapp=10000"
# A frontier nobody touched for this long is in the past anyway; let Redis forget it.
KEY_TTL_SECONDS = 3600

# KEYS[1]: the channel's frontier hash {s: second, u: used in it}. ARGV: n, rate, earliest offset, ttl.
# Returns a flat list [offset, count, offset, count, …] of seconds from now (Redis' clock) and deliveries.
_RESERVE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1])
local n = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local s = tonumber(redis.call('HGET', KEYS[1], 's') or '0')
local u = tonumber(redis.call('HGET', KEYS[1], 'u') or '0')
local start = now + tonumber(ARGV[3])
if s < start then
  s = start
  u = 0
end
local out = {}
while n > 0 do
  if u >= rate then
    s = s + 1
    u = 0
  end
  local take = math.min(rate - u, n)
  out[#out + 1] = s - now
  out[#out + 1] = take
  u = u + take
  n = n - take
end
redis.call('HSET', KEYS[1], 's', s, 'u', u)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
return out
"""
# Seconds from now to the end of the frontier (0 when it is not ahead): how far the reservations reach.
_AHEAD_LUA = """
local now = tonumber(redis.call('TIME')[1])
local best = 0
for i, key in ipairs(KEYS) do
  local s = tonumber(redis.call('HGET', key, 's') or '0')
  if s - now + 1 > best then
    best = s - now + 1
  end
end
return best
"""

_guard = RedisGuard("fan-out pace")
_scripts: dict[tuple[int, str], Any] = {}
_local: dict[str, tuple[int, int]] = {}
_local_lock = threading.Lock()


def parse_pace(spec: str) -> dict[str, int]:
    """Parse "channel=rate;…" ("*" for the rest, 0 for unpaced) into {channel: deliveries per second}.

    Raises ValueError naming a part that is not `name=non-negative integer`.
    """
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        channel, sep, rate = part.partition("=")
        if not sep or not channel.strip() or not rate.strip().isdigit():
            raise ValueError(f"FANOUT_HIGH_PACE: '{part}' is not 'channel=deliveries per second' (or '*=…')")
        out[channel.strip()] = int(rate)
    return out


def pace_for(channel: str) -> int:
    """Return the deliveries per second a fan-out may put into `<channel>.high` (0: unpaced)."""
    rates = parse_pace(getattr(settings, "FANOUT_HIGH_PACE", DEFAULT_PACE) or "")
    return rates.get(channel, rates.get("*", 0))


def _key(channel: str) -> str:
    return rkey("fanout-pace", channel)


def _script(client: Any, source: str) -> Any:
    # One Script object per client and source: it hashes once and reloads itself after a NOSCRIPT.
    cache_key = (id(client), source)
    script = _scripts.get(cache_key)
    if script is None:
        script = _scripts[cache_key] = client.register_script(source)
    return script


def _local_rate(rate: int) -> int:
    return max(1, rate // max(1, int(getattr(settings, "RESILIENCE_ASSUMED_WORKERS", 4))))


def _reserve_local(channel: str, n: int, rate: int, earliest: int) -> list[tuple[int, int]]:
    """Reserve like the Lua script, in this process only (Redis unreachable)."""
    rate = _local_rate(rate)
    with _local_lock:
        now = int(time.time())
        second, used = _local.get(channel, (0, 0))
        if second < now + earliest:
            second, used = now + earliest, 0
        parts: list[tuple[int, int]] = []
        while n > 0:
            if used >= rate:
                second, used = second + 1, 0
            take = min(rate - used, n)
            parts.append((second - now, take))
            used, n = used + take, n - take
        _local[channel] = (second, used)
    return parts


def reserve(channel: str, n: int, *, earliest: float = 0.0) -> list[tuple[int, int]]:
    """Reserve send seconds for `n` deliveries of `channel` into its high queue, none before `earliest` s from now.

    Returns [(countdown in whole seconds, how many), …] in order, covering n; [(0, n)] when unpaced.
    """
    rate = pace_for(channel)
    if n <= 0:
        return []
    if rate <= 0:
        return [(math.ceil(earliest), n)]
    start = max(0, math.ceil(earliest))

    def call(client: Any) -> list[tuple[int, int]]:
        flat = _script(client, _RESERVE_LUA)(keys=[_key(channel)], args=[n, rate, start, KEY_TTL_SECONDS])
        return [(int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2)]

    parts: list[tuple[int, int]] = _guard.run(call, lambda: _reserve_local(channel, n, rate, start))
    return parts


def seconds_ahead(channels: list[str]) -> float:
    """Return how many seconds ahead of now the reservations of these channels reach (0: none pending)."""
    paced = [c for c in channels if pace_for(c) > 0]
    if not paced:
        return 0.0

    def local() -> float:
        now = int(time.time())
        with _local_lock:
            return float(max((_local.get(c, (0, 0))[0] - now + 1 for c in paced), default=0))

    def call(client: Any) -> float:
        return float(_script(client, _AHEAD_LUA)(keys=[_key(c) for c in paced]))

    return max(0.0, float(_guard.run(call, local)))


def paced_channels(channels: list[str]) -> list[str]:
    """Return the channels among `channels` whose high queue is paced."""
    return [c for c in channels if pace_for(c) > 0]


def reset(channels: list[str]) -> None:
    """Forget the frontier of these channels (tests and benchmarks start from an idle pace)."""
    with _local_lock:
        for channel in channels:
            _local.pop(channel, None)
    _guard.run(lambda client: client.delete(*[_key(c) for c in channels]), lambda: None)
