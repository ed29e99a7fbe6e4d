"""The workers' consumer steps that run without a broker: the shutdown tick."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kombu.asynchronous import Hub
from kombu.asynchronous.timer import Timer

from core.broker_consumer import SHUTDOWN_TICK_SECONDS, Consumer, ShutdownTick


def _consumer(hub: Hub | None) -> Any:
    return SimpleNamespace(hub=hub)


def _live_entries(hub: Hub) -> int:
    return len([item for item in hub.timer.queue if not item.entry.canceled])


@pytest.mark.pure
def test_the_tick_bounds_how_long_the_event_loop_polls_and_goes_with_the_consumer() -> None:
    """With an entry a minute away (a heartbeat check), the loop would poll 10 s; with the tick, a second.

    The poll's timeout is what a SIGTERM waits before the warm shutdown begins: Celery's handler only sets a flag
    that the loop reads between polls.
    """
    hub = Hub(timer=Timer(max_interval=10.0))  # as a worker's event loop has it (celery.worker.components)
    try:
        hub.call_later(60, lambda: None)
        assert hub.fire_timers() == 10  # Celery's loop without the tick: up to 10 s per poll
        step = ShutdownTick(_consumer(hub))
        step.start(_consumer(hub))
        step.start(_consumer(hub))  # started twice (a restart without a stop): still one entry
        assert _live_entries(hub) == 2
        assert hub.fire_timers() <= SHUTDOWN_TICK_SECONDS
        step.stop(_consumer(hub))
        assert _live_entries(hub) == 1  # cancelled: the consumer's next start makes its own
        step.start(_consumer(None))  # no event loop: nothing to wake, nothing started
        assert _live_entries(hub) == 1
    finally:
        hub.close()


@pytest.mark.pure
def test_the_workers_consumer_runs_the_tick() -> None:
    """The consumer Celery is configured with (worker_consumer) has the step among its own."""
    assert f"{ShutdownTick.__module__}:ShutdownTick" in Consumer.Blueprint.default_steps
