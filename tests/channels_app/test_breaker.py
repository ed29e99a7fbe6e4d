"""Circuit breakers against the real Redis: opening on the error rate, failing fast, limited half-open probes
across processes, closing, the state-change hook and the degraded in-memory mode."""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings

from channels_app import breaker as breaker_module
from channels_app.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreakers
from tests.clients.test_ratelimit import closed_port


@pytest.fixture
def changes() -> Iterator[list[tuple[str, str, str]]]:
    """Collect state changes through the public hook."""
    seen: list[tuple[str, str, str]] = []

    def listener(provider: str, old: str, new: str) -> None:
        seen.append((provider, old, new))

    breaker_module.on_state_change(listener)
    yield seen
    breaker_module._listeners.remove(listener)


def _configure(settings: Any, **conf: Any) -> None:
    settings.PROVIDER_CIRCUIT_BREAKERS = {
        "default": {
            "window_seconds": 30, "bucket_seconds": 10, "min_calls": 10, "failure_threshold": 0.5,
            "cooldown_seconds": 0.5, "half_open_probes": 2, **conf,
        }
    }  # fmt: skip


def _fresh() -> CircuitBreakers:
    return CircuitBreakers(redis.Redis.from_url(django_settings.REDIS_URL))


def _open(breakers: CircuitBreakers, provider: str = "p") -> None:
    breakers.record(provider, ok=False, n=10)
    assert breakers.state(provider) == OPEN


def test_opens_when_error_rate_passes_threshold(settings: Any, changes: list[tuple[str, str, str]]) -> None:
    _configure(settings)
    cb = _fresh()
    cb.record("p", ok=True, n=5)
    cb.record("p", ok=False, n=4)
    assert cb.state("p") == CLOSED  # 9 calls: below the minimum, whatever the rate
    cb.record("p", ok=False)
    assert cb.state("p") == OPEN  # 5 of 10 failed
    assert changes == [("p", CLOSED, OPEN)]
    assert cb.state("other") == CLOSED  # one provider's trouble is its own


def test_stays_closed_below_threshold(settings: Any) -> None:
    _configure(settings)
    cb = _fresh()
    cb.record("p", ok=True, n=20)
    cb.record("p", ok=False, n=9)
    assert cb.state("p") == CLOSED
    assert cb.admit("p", 500).allowed == 500


def test_open_fails_fast_for_the_cooldown(settings: Any) -> None:
    _configure(settings, cooldown_seconds=30)
    cb = _fresh()
    _open(cb)
    admission = cb.admit("p", 500)
    assert admission.allowed == 0
    assert admission.state == OPEN
    assert 29 < admission.retry_in <= 30
    assert not cb.allow("p")
    # A second client (another worker) sees the same open breaker.
    assert not _fresh().allow("p")


def test_old_failures_leave_the_window(settings: Any) -> None:
    _configure(settings, window_seconds=1, bucket_seconds=0.5)
    cb = _fresh()
    cb.record("p", ok=False, n=9)
    time.sleep(1.6)  # more than the window: those failures no longer count
    cb.record("p", ok=False, n=9)
    assert cb.state("p") == CLOSED
    cb.record("p", ok=False, n=1)
    assert cb.state("p") == OPEN


def _probe(start: float, out: Any) -> None:
    cb = _fresh()
    while time.time() < start:
        time.sleep(0.001)
    out.put(cb.allow("p"))


def test_half_open_lets_only_n_probes_through_across_processes(
    settings: Any, changes: list[tuple[str, str, str]]
) -> None:
    # The cool-down is also the lease of a probe slot: long enough for the checks below to see them taken.
    _configure(settings, half_open_probes=2, cooldown_seconds=3)
    cb = _fresh()
    _open(cb)
    time.sleep(3.1)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start = time.time() + 0.5
    procs = [ctx.Process(target=_probe, args=(start, out)) for _ in range(8)]
    for proc in procs:
        proc.start()
    answers = [out.get(timeout=30) for _ in procs]
    for proc in procs:
        proc.join(timeout=10)
    assert sorted(answers) == [False] * 6 + [True] * 2
    assert cb.state("p") == HALF_OPEN
    assert cb.admit("p", 10).allowed == 0  # every probe slot is taken until they report
    cb.record("p", ok=True)
    assert cb.state("p") == HALF_OPEN
    cb.record("p", ok=True)
    assert cb.state("p") == CLOSED
    assert cb.admit("p", 10).allowed == 10
    # The transition into half-open happened in a child process; the parent saw open and close.
    assert ("p", CLOSED, OPEN) in changes and ("p", HALF_OPEN, CLOSED) in changes


def test_half_open_failure_reopens(settings: Any, changes: list[tuple[str, str, str]]) -> None:
    _configure(settings, half_open_probes=3, cooldown_seconds=0.3)
    cb = _fresh()
    _open(cb)
    time.sleep(0.4)
    admission = cb.admit("p", 500)  # a batch gets only the probe slots
    assert (admission.allowed, admission.state) == (3, HALF_OPEN)
    cb.record("p", ok=True)
    cb.record("p", ok=False)
    assert cb.state("p") == OPEN
    assert not cb.allow("p")
    assert changes == [("p", CLOSED, OPEN), ("p", OPEN, HALF_OPEN), ("p", HALF_OPEN, OPEN)]


def test_lost_probes_are_forgotten_after_a_cooldown(settings: Any) -> None:
    _configure(settings, half_open_probes=1, cooldown_seconds=0.3)
    cb = _fresh()
    _open(cb)
    time.sleep(0.4)
    assert cb.allow("p")  # this probe's worker "dies" and never records
    assert not cb.allow("p")
    time.sleep(0.4)
    assert cb.allow("p")  # a new probe round, instead of half-open forever


def test_listener_errors_do_not_break_the_breaker(settings: Any) -> None:
    _configure(settings)

    def broken(provider: str, old: str, new: str) -> None:
        raise RuntimeError("metrics down")

    breaker_module.on_state_change(broken)
    try:
        cb = _fresh()
        _open(cb)
    finally:
        breaker_module._listeners.remove(broken)


def test_degraded_mode_when_redis_is_unreachable(
    settings: Any, caplog: pytest.LogCaptureFixture, changes: list[tuple[str, str, str]]
) -> None:
    _configure(settings, min_calls=8, half_open_probes=4, cooldown_seconds=0.3)
    settings.RESILIENCE_ASSUMED_WORKERS = 4
    cb = CircuitBreakers(redis.Redis(host="127.0.0.1", port=closed_port(), socket_connect_timeout=0.2))
    with caplog.at_level(logging.WARNING, logger="core.redis_guard"):
        assert cb.allow("p")
        cb.record("p", ok=False)
        assert cb.state("p") == CLOSED  # this process's minimum is 8 / 4 = 2 calls
        cb.record("p", ok=False)
        assert cb.state("p") == OPEN
        assert cb.admit("p", 5).allowed == 0
        time.sleep(0.4)
        admission = cb.admit("p", 5)
        assert (admission.allowed, admission.degraded) == (1, True)  # 4 probes / 4 workers
        cb.record("p", ok=True)
        assert cb.state("p") == CLOSED
    assert len([r for r in caplog.records if "degraded" in r.getMessage()]) == 1
    assert [c[1:] for c in changes] == [(CLOSED, OPEN), (OPEN, HALF_OPEN), (HALF_OPEN, CLOSED)]
