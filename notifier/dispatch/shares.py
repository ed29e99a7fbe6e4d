"""Fair shares of a throttled send queue between broadcasts: how much a fan-out page may feed into it now.

A broadcast (a topic notification or a campaign run) at normal or low priority shares its `<channel>.low` queue
with every project's singles. Unbounded, a 100,000-recipient topic puts its 100,000 deliveries into the queue in
seconds and a single published a moment later waits behind all of them, for as long as the provider takes to
send them (100 s at 1,000/s). So a fan-out page asks this module first, per queue its deliveries go to:

- **Room.** The queue holds at most `FAIR_HORIZON_SECONDS` (1) of the provider's current rate worth of broadcast
  deliveries. The amount in the broker is estimated as a leaky bucket: each grant adds to the level, which
  drains at the rate of the channel's first provider as the shared limiter has it now (core/ratelimit.py: the
  configured rate, cut by AIMD after throttled answers). A page takes at most the room; the rest of the topic
  waits in PostgreSQL as subscribers not yet paged (the lane's checkpoint), to be paged when room appears.
- **Turns.** Within the room, projects take turns weighted by `Project.weight`, and the broadcasts of one
  project take turns equally: each has a virtual clock (deliveries fed / weight for a project, fed for a
  broadcast), and one may run ahead of the slowest one still asking by a quarter of a room at most. A project
  that starts asking (again) starts at the slowest active clock, so idle time is not saved up.
- **Only throttled queues.** A queue whose provider has no rate limit (in-app, by default) is not gated: its
  fan-out runs at today's speed. High priority has its own pace (notifier/dispatch/pace.py).

A workflow triggered for a topic is a broadcast sent one single per run: its advance messages ask too (flow
`wf:<notification id>`) for the runs reaching a send step, hold back the runs not granted (running, with a
`wake_at`, for the wake relay) and settle with the deliveries queued; the flow's backlog then counts its runs
held back, which `settle` moves (notifier/workflows/services.py, `_room`).

Every call is one Lua script on Redis' clock, over one hash per queue, so every fan-out process on every host
shares the level and the clocks. Redis unreachable: nothing is held back (fan-out as without this module).
Singles never ask: they are published at accept, so they wait behind at most the room of broadcast work.

The hash also keeps, for /metrics, each project's deliveries fed, its broadcasts' remaining subscribers
(backlog) and since when it has been waiting without a grant.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from core import ratelimit
from core.redis_guard import RedisGuard, redis_script, rkey

logger = logging.getLogger(__name__)

# A flow (broadcast) or project that has not asked for this long no longer holds the others back.
ACTIVE_SECONDS = 3.0
# Fields of flows idle for this long are dropped from the hash.
FORGET_SECONDS = 120.0
KEY_TTL_SECONDS = 3600

# KEYS[1]: the queue's hash. ARGV: rate, horizon, project, weight, flow, want, now-less active seconds,
# forget seconds, ttl, min chunk, backlog (subscribers the flow has not yet paged, -1: unknown).
# Fields: lvl, ts (the bucket); pv:<p> (project clock), pa:<p> (last ask), pw:<p> (weight), pf:<p> (fed total),
# pq:<p> (first ask without grant since the last grant); fv:<f> (flow fed), fa:<f> (last ask), fp:<f> (its
# project), fb:<f> (its backlog).
# Returns {granted, wait in ms, reason, others, backlog}: reason 0 granted, 1 no room, 2 not this flow's turn;
# others 1 when another broadcast is asking for the queue too; backlog the flow's fb before this ask.
_ASK_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local horizon = tonumber(ARGV[2])
local p = ARGV[3]
local w = tonumber(ARGV[4])
local f = ARGV[5]
local want = tonumber(ARGV[6])
local active = tonumber(ARGV[7])
local forget = tonumber(ARGV[8])
local min_chunk = tonumber(ARGV[10])
local backlog = tonumber(ARGV[11])
local quantum = min_chunk
local h = redis.call('HGETALL', key)
local fields = {}
for i = 1, #h, 2 do fields[h[i]] = h[i + 1] end
local lvl = tonumber(fields['lvl'] or '0')
local ts = tonumber(fields['ts'] or tostring(now))
lvl = math.max(0, lvl - (now - ts) * rate)
local cap = rate * horizon
-- the slowest clocks among the others still asking; drop flows idle for long
local pmin, fmin = nil, nil
for name, value in pairs(fields) do
  local kind, id = string.sub(name, 1, 3), string.sub(name, 4)
  if kind == 'pa:' and id ~= p and now - tonumber(value) <= active then
    local v = tonumber(fields['pv:' .. id] or '0')
    if pmin == nil or v < pmin then pmin = v end
  elseif kind == 'fa:' then
    local age = now - tonumber(value)
    if id ~= f and age <= active and fields['fp:' .. id] == p then
      local v = tonumber(fields['fv:' .. id] or '0')
      if fmin == nil or v < fmin then fmin = v end
    elseif age > forget then
      redis.call('HDEL', key, 'fa:' .. id, 'fv:' .. id, 'fp:' .. id, 'fb:' .. id)
    end
  end
end
local pv = tonumber(fields['pv:' .. p] or '0')
local fv = tonumber(fields['fv:' .. f] or '0')
-- a project (or flow) coming back after a pause starts at the slowest clock still running
local pa = tonumber(fields['pa:' .. p] or '0')
if pmin ~= nil and now - pa > active then pv = math.max(pv, pmin) end
local fa = tonumber(fields['fa:' .. f] or '0')
if fmin ~= nil and now - fa > active then fv = math.max(fv, fmin) end
local grant = math.min(want, math.floor(cap - lvl))
local reason = 0
if grant < math.min(want, min_chunk) then
  grant = 0
  reason = 1
end
if grant > 0 and pmin ~= nil then
  local ahead = math.floor((pmin + quantum / w - pv) * w)
  if ahead < grant then grant = math.max(0, ahead) end
  if grant < math.min(want, min_chunk) then grant = 0; reason = 2 end
end
if grant > 0 and fmin ~= nil then
  local ahead = math.floor(fmin + quantum - fv)
  if ahead < grant then grant = math.max(0, ahead) end
  if grant < math.min(want, min_chunk) then grant = 0; reason = 2 end
end
local wait = 0
if grant > 0 then
  lvl = lvl + grant
  pv = pv + grant / w
  fv = fv + grant
  redis.call('HINCRBY', key, 'pf:' .. p, grant)
  redis.call('HDEL', key, 'pq:' .. p)
elseif reason == 1 then
  wait = (lvl - cap + math.min(want, min_chunk)) / rate
  if fields['pq:' .. p] == nil then redis.call('HSET', key, 'pq:' .. p, now) end
else
  wait = horizon
  if fields['pq:' .. p] == nil then redis.call('HSET', key, 'pq:' .. p, now) end
end
redis.call('HSET', key, 'lvl', lvl, 'ts', now, 'pv:' .. p, pv, 'pa:' .. p, now, 'pw:' .. p, w,
  'fv:' .. f, fv, 'fa:' .. f, now, 'fp:' .. f, p)
if backlog >= 0 then redis.call('HSET', key, 'fb:' .. f, math.max(0, backlog - grant)) end
redis.call('EXPIRE', key, tonumber(ARGV[9]))
local others = 0
if pmin ~= nil or fmin ~= nil then others = 1 end
return {grant, math.ceil(math.max(wait, 0) * 1000), reason, others, tonumber(fields['fb:' .. f] or '0')}
"""

# Give back (or add) deliveries after the page: the level, the project's and the flow's clocks move by `delta`;
# the flow's backlog by `backlog` (workflow runs held back, never below 0).
# KEYS[1]: the queue's hash. ARGV: rate, project, weight, flow, delta, backlog.
_SETTLE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local delta = tonumber(ARGV[5])
local lvl = tonumber(redis.call('HGET', key, 'lvl') or '0')
local ts = tonumber(redis.call('HGET', key, 'ts') or tostring(now))
lvl = math.max(0, lvl - (now - ts) * rate + delta)
local pv = tonumber(redis.call('HGET', key, 'pv:' .. ARGV[2]) or '0')
local fv = tonumber(redis.call('HGET', key, 'fv:' .. ARGV[4]) or '0')
redis.call('HSET', key, 'lvl', lvl, 'ts', now, 'pv:' .. ARGV[2], math.max(0, pv + delta / tonumber(ARGV[3])),
  'fv:' .. ARGV[4], math.max(0, fv + delta))
redis.call('HINCRBY', key, 'pf:' .. ARGV[2], delta)
local moved = tonumber(ARGV[6])
if moved ~= 0 then
  local fb = tonumber(redis.call('HGET', key, 'fb:' .. ARGV[4]) or '0')
  redis.call('HSET', key, 'fb:' .. ARGV[4], math.max(0, fb + moved))
end
return 1
"""

_guard = RedisGuard("fair shares")
_rates: dict[str, tuple[float, float | None]] = {}
_rates_lock = threading.Lock()
# How long a process reuses a provider's current rate read from the shared limiter.
RATE_CACHE_SECONDS = 0.5


@dataclass(frozen=True)
class Share:
    """What a queue granted one flow: deliveries it may feed now, else how long to wait and why."""

    granted: int
    wait: float = 0.0
    # "" granted, "room" the queue holds its horizon of broadcast work, "turn" others are behind this flow
    reason: str = ""
    # Whether other broadcasts are asking for the queue too.
    contended: bool = False
    # The flow's backlog as the queue had it before this ask (a workflow's runs held back: see `settle`).
    backlog: int = 0


def horizon_seconds() -> float:
    """Return how many seconds of a queue's provider rate broadcasts may hold in it (FAIR_HORIZON_SECONDS, 1)."""
    return float(getattr(settings, "FAIR_HORIZON_SECONDS", 1.0))


def enabled() -> bool:
    """Return whether broadcasts are fed by room and turns (FAIR_SHARES, default true)."""
    return bool(getattr(settings, "FAIR_SHARES", True))


def queue_key(queue: str) -> str:
    """Return the Redis key of a queue's shares."""
    return rkey("fair", queue)


def channel_rate(channel: str) -> float | None:
    """Return the current shared rate of the channel's first provider (None: unlimited, not gated)."""
    chain = settings.CHANNEL_PROVIDERS.get(channel) or []
    if not chain:
        return None
    provider = chain[0]
    now = time.monotonic()
    with _rates_lock:
        cached = _rates.get(provider)
    if cached is not None and now - cached[0] < RATE_CACHE_SECONDS:
        return cached[1]
    limit, _ = ratelimit.limit_for(provider)
    rate: float | None = None
    if limit.rate is not None:
        try:
            current = ratelimit.snapshot(provider).get("rate")
        except Exception:  # the limiter's reader never raises on Redis errors; anything else: the configured rate
            current = None
        rate = float(current) if current else float(limit.rate)
    with _rates_lock:
        _rates[provider] = (now, rate)
    return rate


_REASONS = {0: "", 1: "room", 2: "turn"}


def ask(
    queue: str, *, rate: float, project: int, weight: int, flow: str, want: int, backlog: int | None = None
) -> Share:
    """Ask for room for `want` deliveries of broadcast `flow` (of `project`, weighted `weight`) in `queue`.

    `backlog` is how many subscribers the flow has not yet paged, for the operators' metrics.
    """
    if want <= 0:
        return Share(0)
    horizon = horizon_seconds()
    # A grant smaller than this is not worth a page: wait until a quarter of the horizon's room is free.
    min_chunk = max(1, int(rate * horizon / 4))

    def call(client: Any) -> Share:
        granted, wait_ms, reason, others, held = redis_script(_ASK_LUA)(
            client=client,
            keys=[queue_key(queue)],
            args=[
                rate,
                horizon,
                project,
                max(1, weight),
                flow,
                want,
                ACTIVE_SECONDS,
                FORGET_SECONDS,
                KEY_TTL_SECONDS,
                min_chunk,
                -1 if backlog is None else backlog,
            ],
        )
        return Share(int(granted), int(wait_ms) / 1000.0, _REASONS.get(int(reason), ""), bool(int(others)), int(held))

    share: Share = _guard.run(call, lambda: Share(want))
    return share


def settle(queue: str, *, rate: float, project: int, weight: int, flow: str, delta: int, backlog: int = 0) -> None:
    """Correct a grant by what the page really fed: `delta` = fed - granted (negative gives room back).

    `backlog` moves the flow's backlog: a workflow's runs newly held back minus those held that went on.
    """
    if not delta and not backlog:
        return

    def call(client: Any) -> None:
        redis_script(_SETTLE_LUA)(
            client=client, keys=[queue_key(queue)], args=[rate, project, max(1, weight), flow, delta, backlog]
        )

    _guard.run(call, lambda: None)


@dataclass
class ProjectShare:
    """One project's state on one queue, for /metrics."""

    queue: str
    project: int
    fed: int
    backlog: int
    waiting_seconds: float
    share: float


def state(queues: list[str]) -> list[ProjectShare]:
    """Return every project's fed total, backlog, wait and entitled share on each of `queues` (Redis down: [])."""

    def call(client: Any) -> list[ProjectShare]:
        pipe = client.pipeline(transaction=False)
        pipe.time()
        for queue in queues:
            pipe.hgetall(queue_key(queue))
        sec_usec, *hashes = pipe.execute()
        now = int(sec_usec[0]) + int(sec_usec[1]) / 1e6
        out: list[ProjectShare] = []
        for queue, raw in zip(queues, hashes, strict=True):
            fields = {k.decode() if isinstance(k, bytes) else k: v for k, v in raw.items()}
            out.extend(_project_shares(queue, fields, now))
        return out

    result: list[ProjectShare] = _guard.run(call, list)
    return result


def _project_shares(queue: str, fields: dict[str, Any], now: float) -> list[ProjectShare]:
    projects = {name[3:] for name in fields if name.startswith("pf:")}
    active = {p for p in projects if now - float(fields.get(f"pa:{p}", 0)) <= ACTIVE_SECONDS}
    weights = {p: max(1.0, float(fields.get(f"pw:{p}", 1))) for p in projects}
    total = sum(weights[p] for p in active) or 1.0
    backlog: dict[str, int] = dict.fromkeys(projects, 0)
    for name, value in fields.items():
        if name.startswith("fb:"):
            owner = fields.get(f"fp:{name[3:]}")
            owner = owner.decode() if isinstance(owner, bytes) else owner
            if owner in backlog:
                backlog[owner] += int(float(value))
    out = []
    for p in sorted(projects):
        since = fields.get(f"pq:{p}")
        out.append(
            ProjectShare(
                queue=queue,
                project=int(p),
                fed=int(float(fields[f"pf:{p}"])),
                backlog=backlog[p],
                waiting_seconds=max(0.0, now - float(since)) if since is not None else 0.0,
                share=weights[p] / total if p in active else 0.0,
            )
        )
    return out


# Take a finished flow out of a queue's turns; its project too when none of its flows is left.
# KEYS[1]: the queue's hash. ARGV: project, flow.
_LEAVE_LUA = """
local key = KEYS[1]
redis.call('HDEL', key, 'fa:' .. ARGV[2], 'fv:' .. ARGV[2], 'fp:' .. ARGV[2], 'fb:' .. ARGV[2])
local h = redis.call('HGETALL', key)
for i = 1, #h, 2 do
  if string.sub(h[i], 1, 3) == 'fp:' and h[i + 1] == ARGV[1] then return 0 end
end
redis.call('HDEL', key, 'pa:' .. ARGV[1], 'pq:' .. ARGV[1])
return 1
"""


def leave(queue: str, *, project: int, flow: str) -> None:
    """Take a finished broadcast out of the turns of `queue` (its project too, when it was its last)."""
    _guard.run(
        lambda client: redis_script(_LEAVE_LUA)(client=client, keys=[queue_key(queue)], args=[project, flow]),
        lambda: None,
    )


# --- render cost: what a delivery of a template costs the send workers beyond its provider slot ---------------

# A template rendering faster than this a delivery costs its flow nothing extra (and writes nothing to Redis).
RENDER_COST_FLOOR_SECONDS = 0.001
RENDER_COST_TTL_SECONDS = 600
# A process tells a template's cost again only when it moved by a quarter or is older than this.
RENDER_COST_REFRESH_SECONDS = 10.0
# What this process last told, by field: (seconds, when).
_cost_written: dict[str, tuple[float, float]] = {}


def render_cost_key() -> str:
    """Return the Redis key of the templates' render cost per delivery (a hash by environment and template key)."""
    return rkey("fair", "render-cost")


def render_cost_record(costs: dict[tuple[int, str], float]) -> None:
    """Keep the seconds of rendering a delivery of each (environment, template key) cost a send worker just now.

    Measured per batch: the rendering's time over the batch's deliveries that used it, so a rendering shared by
    a broadcast's deliveries costs each of them next to nothing, and one per recipient (a digest) all of it.
    Only costs above RENDER_COST_FLOOR_SECONDS are written, and the fall of one this process wrote before; a
    cost within a quarter of what this process last wrote is written again only every
    RENDER_COST_REFRESH_SECONDS (a batch of singles of an email with a layout can cost a millisecond: not a Redis
    call each).
    """
    fields: dict[str, float] = {}
    now = time.monotonic()
    for (environment_id, template_key), seconds in costs.items():
        name = f"{environment_id}:{template_key}"
        last, when = _cost_written.get(name, (0.0, 0.0))
        if seconds < RENDER_COST_FLOOR_SECONDS and last < RENDER_COST_FLOOR_SECONDS:
            continue
        if abs(seconds - last) <= last / 4 and now - when < RENDER_COST_REFRESH_SECONDS:
            continue
        fields[name] = round(seconds, 6)
        _cost_written[name] = (seconds, now)
    if not fields:
        return

    def call(client: Any) -> None:
        pipe = client.pipeline(transaction=False)
        pipe.hset(render_cost_key(), mapping=fields)
        pipe.expire(render_cost_key(), RENDER_COST_TTL_SECONDS)
        pipe.execute()

    _guard.run(call, lambda: None)


def render_costs_written() -> bool:
    """Return whether this process has told a cost above the floor (whose fall it must tell too)."""
    return any(seconds >= RENDER_COST_FLOOR_SECONDS for seconds, _ in _cost_written.values())


def render_cost(environment_id: int, template_key: str) -> float:
    """Return the seconds a delivery of this template last cost the send workers to render (0: below the floor)."""

    def call(client: Any) -> float:
        value = client.hget(render_cost_key(), f"{environment_id}:{template_key}")
        return float(value) if value is not None else 0.0

    cost: float = _guard.run(call, lambda: 0.0)
    return cost if cost >= RENDER_COST_FLOOR_SECONDS else 0.0


def render_costs() -> dict[tuple[int, str], float]:
    """Return every (environment, template key) whose deliveries cost the send workers more than the floor."""

    def call(client: Any) -> dict[tuple[int, str], float]:
        out: dict[tuple[int, str], float] = {}
        for name, value in client.hgetall(render_cost_key()).items():
            environment, _, key = (name.decode() if isinstance(name, bytes) else name).partition(":")
            if float(value) >= RENDER_COST_FLOOR_SECONDS:
                out[(int(environment), key)] = float(value)
        return out

    costs: dict[tuple[int, str], float] = _guard.run(call, dict)
    return costs


def units_per_delivery(cost: float, rate: float) -> int:
    """Return how many of a queue's provider slots one delivery takes: its render time at the provider's rate.

    The send workers render a queue's deliveries one after another as far as a queue's room is concerned (its
    bound assumes one worker thread's pace): a delivery whose rendering takes as long as five provider slots
    counts as five, so the room holds the horizon's worth of the workers' time, not of the provider's.
    """
    return max(1, math.ceil(cost * rate - 1e-9))


def reset(queues: list[str]) -> None:
    """Forget the shares of these queues (tests and benchmarks start from an idle queue)."""
    with _rates_lock:
        _rates.clear()
    _cost_written.clear()
    _guard.run(lambda client: client.delete(*[queue_key(q) for q in queues], render_cost_key()), lambda: None)
