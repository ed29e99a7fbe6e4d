"""The shared rate limiter against the real Redis: bucket rate across processes, priority reserve, AIMD,
per-account buckets and the degraded in-memory mode."""

from __future__ import annotations

import logging
import multiprocessing as mp
import socket
import time
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings

from core.ratelimit import RateLimiter, bucket_key


def _limits(settings: Any, **providers: dict[str, Any]) -> None:
    settings.PROVIDER_RATE_LIMITS = providers


def _fresh_limiter() -> RateLimiter:
    return RateLimiter(redis.Redis.from_url(django_settings.REDIS_URL))


def closed_port() -> int:
    """Return a loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _hammer(provider: str, priority: str, start: float, end: float, chunk: int, out: Any) -> None:
    """Take tokens as fast as granted between `start` and `end` (wall clock); report the count granted."""
    limiter = _fresh_limiter()
    while time.time() < start:
        time.sleep(0.001)
    granted = 0
    while time.time() < end:
        grant = limiter.acquire(provider, chunk, priority=priority)
        granted += grant.granted
        if grant.granted < chunk:
            time.sleep(min(grant.wait, 0.02))
    out.put((priority, granted))


def _run_hammers(provider: str, priorities: list[str], seconds: float, chunk: int = 3) -> dict[str, int]:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start = time.time() + 0.5
    procs = [
        ctx.Process(target=_hammer, args=(provider, prio, start, start + seconds, chunk, out)) for prio in priorities
    ]
    for proc in procs:
        proc.start()
    totals: dict[str, int] = {}
    for _ in procs:
        prio, granted = out.get(timeout=seconds + 30)
        totals[prio] = totals.get(prio, 0) + granted
    for proc in procs:
        proc.join(timeout=10)
        assert proc.exitcode == 0
    return totals


def test_burst_then_refill_with_wait(settings: Any) -> None:
    _limits(settings, p={"rate": 10, "burst": 10, "high_reserve": 0})
    limiter = _fresh_limiter()
    first = limiter.acquire("p", 15)
    assert first.granted == 10
    assert 0 < first.wait <= 0.11  # the next token is one tenth of a second away
    assert not first.degraded
    time.sleep(0.35)
    later = limiter.acquire("p", 15)
    assert 3 <= later.granted <= 5  # refilled at 10/s while we slept, not to the full burst


def test_unlimited_provider_grants_everything(settings: Any) -> None:
    _limits(settings, free={"rate": None})
    limiter = _fresh_limiter()
    assert limiter.acquire("free", 10_000).granted == 10_000
    assert not redis.Redis.from_url(settings.REDIS_URL).exists(bucket_key("free"))


@pytest.mark.slow
def test_rate_holds_across_two_processes(settings: Any) -> None:
    rate, burst, seconds = 40.0, 20.0, 3.0
    _limits(settings, shared={"rate": rate, "burst": burst, "high_reserve": 0})
    totals = _run_hammers("shared", ["high", "high"], seconds)
    expected = burst + rate * seconds  # 140: what the bucket allows, whoever asks
    assert totals["high"] <= expected * 1.05 + 3
    # Loose: tokens are only lost if both processes stall for half a second (the burst) at once.
    assert totals["high"] >= expected * 0.8


def test_low_priority_never_takes_the_reserve(settings: Any) -> None:
    _limits(settings, p={"rate": 1, "burst": 20, "high_reserve": 0.5})
    limiter = _fresh_limiter()
    assert limiter.acquire("p", 100, priority="low").granted == 10  # burst minus the reserve of 10
    starved = limiter.acquire("p", 100, priority="low")
    assert starved.granted == 0
    assert starved.wait > 0.9  # low must wait for the bucket to climb back above the reserve
    assert limiter.acquire("p", 100, priority="normal").granted == 0
    assert limiter.acquire("p", 100, priority="high").granted == 10  # the reserve is there for an OTP


@pytest.mark.slow
def test_reserve_holds_under_low_priority_saturation(settings: Any) -> None:
    rate, burst, seconds = 20.0, 20.0, 3.0
    _limits(settings, p={"rate": rate, "burst": burst, "high_reserve": 0.5})
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start = time.time() + 0.5
    flood = [ctx.Process(target=_hammer, args=("p", "low", start, start + seconds, 5, out)) for _ in range(2)]
    for proc in flood:
        proc.start()
    limiter = _fresh_limiter()
    while time.time() < start + 0.5:  # let the flood drain the bucket down to the reserve first
        time.sleep(0.01)
    # High asks for 5/s (a quarter of the rate) while two processes saturate low.
    asked = granted = 0
    while time.time() < start + seconds - 0.2:
        asked += 1
        granted += limiter.acquire("p", 1, priority="high").granted
        time.sleep(0.2)
    low = 0
    for _ in flood:
        low += out.get(timeout=30)[1]
    for proc in flood:
        proc.join(timeout=10)
    assert asked >= 5
    assert granted == asked  # every OTP found a token
    # The flood got what was left and never more than the bucket allows.
    assert low <= burst + rate * seconds - granted + 3
    assert low >= rate * seconds * 0.5


def test_account_bucket_limits_each_sender(settings: Any) -> None:
    _limits(
        settings,
        sms={"rate": 100, "burst": 100, "high_reserve": 0, "per_account": {"rate": 1, "burst": 2},
             "accounts": {"+15550009999": {"rate": 10, "burst": 10}}},
    )  # fmt: skip
    limiter = _fresh_limiter()
    assert limiter.acquire("sms", 5, account="+15550000001").granted == 2
    assert limiter.acquire("sms", 5, account="+15550000001").granted == 0
    assert limiter.acquire("sms", 5, account="+15550000002").granted == 2
    assert limiter.acquire("sms", 50, account="+15550009999").granted == 10
    # Every grant also came out of the provider's bucket.
    assert limiter.acquire("sms", 1000).granted == 100 - 14


def test_aimd_cut_pause_and_recovery(settings: Any) -> None:
    _limits(settings, p={"rate": 100, "burst": 10, "high_reserve": 0, "min_rate": 20, "increase": 1})
    limiter = _fresh_limiter()
    limiter.on_throttled("p", retry_after=1.0)
    assert limiter.snapshot("p")["rate"] == pytest.approx(50)
    # A second throttled answer from the same burst extends nothing but the pause: no second cut.
    limiter.on_throttled("p")
    assert limiter.snapshot("p")["rate"] == pytest.approx(50)
    paused = limiter.acquire("p", 5)
    assert paused.granted == 0
    assert paused.wait >= 0.9  # Retry-After holds the whole bucket
    time.sleep(1.05)  # past the cut window: the next throttle cuts again, down to the floor at most
    limiter.on_throttled("p")
    assert limiter.snapshot("p")["rate"] == pytest.approx(25)
    time.sleep(1.05)
    limiter.on_throttled("p")
    assert limiter.snapshot("p")["rate"] == pytest.approx(20)  # floor
    limiter.on_success("p", 30)
    assert limiter.snapshot("p")["rate"] == pytest.approx(50)  # additive: +1 per success
    limiter.on_success("p", 1000)
    assert limiter.snapshot("p")["rate"] == pytest.approx(100)  # never above the configured rate


@pytest.mark.slow
def test_aimd_cut_lowers_what_is_granted(settings: Any) -> None:
    rate, seconds = 40.0, 2.0
    _limits(settings, cut={"rate": rate, "burst": 4, "high_reserve": 0, "increase": 0})
    _fresh_limiter().on_throttled("cut")  # halves the rate and empties the bucket
    totals = _run_hammers("cut", ["high", "high"], seconds)
    assert totals["high"] <= rate / 2 * seconds + 4 + 3  # 20/s, not 40/s
    assert totals["high"] >= rate / 2 * seconds * 0.8


def test_shared_between_clients(settings: Any) -> None:
    _limits(settings, p={"rate": 1, "burst": 5, "high_reserve": 0})
    assert _fresh_limiter().acquire("p", 3).granted == 3
    assert _fresh_limiter().acquire("p", 3).granted == 2


def test_degraded_mode_when_redis_is_unreachable(settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    _limits(settings, p={"rate": 40, "burst": 40, "high_reserve": 0.5})
    settings.RESILIENCE_ASSUMED_WORKERS = 4
    limiter = RateLimiter(redis.Redis(host="127.0.0.1", port=closed_port(), socket_connect_timeout=0.2))
    with caplog.at_level(logging.WARNING, logger="core.redis_guard"):
        low = limiter.acquire("p", 100, priority="low")
        high = limiter.acquire("p", 100, priority="high")
        limiter.on_throttled("p", retry_after=0.5)
        limiter.on_success("p", 3)
        after = limiter.acquire("p", 100)
        snap = limiter.snapshot("p")
    # This process's share: 40/4 = 10 tokens, 5 of them reserved for high priority.
    assert (low.granted, high.granted) == (5, 5)
    assert low.degraded and high.degraded
    assert after.granted == 0 and after.wait >= 0.4  # the pause holds in memory too
    assert snap["degraded"] is True and snap["rate"] == pytest.approx(5 + 3 * 0.02)
    degraded_logs = [r for r in caplog.records if "degraded" in r.getMessage()]
    assert len(degraded_logs) == 1


def test_degraded_then_recovers_to_shared_state(settings: Any) -> None:
    _limits(settings, p={"rate": 1, "burst": 4, "high_reserve": 0})
    settings.RESILIENCE_ASSUMED_WORKERS = 2
    good = redis.Redis.from_url(settings.REDIS_URL)
    bad = redis.Redis(host="127.0.0.1", port=closed_port(), socket_connect_timeout=0.2)
    current = {"client": bad}
    limiter = RateLimiter(lambda: current["client"])
    limiter.guard.retry_seconds = 0.0  # try Redis again on the next call
    assert limiter.acquire("p", 10).degraded
    current["client"] = good
    back = limiter.acquire("p", 10)
    assert not back.degraded and back.granted == 4
    assert not limiter.guard.degraded


def test_a_success_at_the_configured_rate_costs_no_round_trip_and_a_cut_elsewhere_still_grows_back(
    settings: Any,
) -> None:
    """A send batch at the configured rate asks Redis once (its acquire); a cut seen at an acquire is grown back."""
    from tests.clients.test_config_cache import _commands_naming

    _limits(settings, p={"rate": 100, "burst": 10, "high_reserve": 0, "min_rate": 20, "increase": 1})
    worker, other = _fresh_limiter(), _fresh_limiter()

    def send_batch() -> None:
        worker.acquire("p", 2)
        worker.on_success("p", 2)

    commands = _commands_naming(bucket_key("p"), send_batch)
    assert [words[0] for words in commands] == ["EVALSHA"], commands  # the acquire; the success wrote nothing
    other.on_throttled("p")  # another process's provider answered 429: the shared rate is halved
    assert worker.snapshot("p")["rate"] == pytest.approx(50)
    worker.on_success("p", 5)  # this process has not seen the cut yet: its success is not reported
    assert worker.snapshot("p")["rate"] == pytest.approx(50)
    worker.acquire("p", 1)  # the next batch's acquire sees it
    worker.on_success("p", 5)
    assert worker.snapshot("p")["rate"] == pytest.approx(55)
    worker.on_success("p", 100)
    assert worker.snapshot("p")["rate"] == pytest.approx(100)
    commands = _commands_naming(bucket_key("p"), lambda: worker.on_success("p", 1))
    assert commands == []  # back at the configured rate: nothing to write, nothing sent
