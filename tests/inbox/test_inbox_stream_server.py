"""The stream server's own machinery in-process: event encoding, a stream's pending events, the garbage collector
policy and the renewal of leases (Redis is the real one). The end-to-end behaviour under uvicorn is in
tests/test_inbox_browser.py and tests/test_inbox_stream_limits.py."""

from __future__ import annotations

import asyncio
import gc
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from notifier.inbox import stream, stream_limits


def _rest(title: str = 'Sale "30%" für alle', url: str = " https://shop.example.com/sale ") -> tuple[Any, ...]:
    """An item row without its id, as the stream's queries read it."""
    created = datetime(2026, 5, 4, 3, 2, 1, 123456, tzinfo=UTC)
    return (uuid.uuid4(), title, "body\u2028line", url, "marketing", "sent", created, None, None)


@pytest.mark.pure
@pytest.mark.parametrize("delivery_id", [0, 7, 1234567890123456789])
def test_a_message_event_built_from_shared_halves_is_the_items_own_encoding(delivery_id: int) -> None:
    rest = _rest()
    head, tail = stream.message_events(rest, 1_700_000_000_123)
    built = head + b"%d" % delivery_id + tail
    assert built == stream.encode("message", stream._item((delivery_id, *rest)), 1_700_000_000_123)
    assert built.startswith(b"id: 1700000000123\nevent: message\ndata: {") and built.endswith(b"}\n\n")


@pytest.mark.pure
def test_an_unsafe_url_is_dropped_in_the_shared_half_too() -> None:
    _, tail = stream.message_events(_rest(url="javascript:alert(1)"), 1)
    assert b'"url":""' in tail


@pytest.mark.pure
def test_a_burst_is_queued_once_per_item_with_its_count_and_wakes_the_pump() -> None:
    async def run() -> None:
        sub = stream.Subscriber(1)
        sub.waiter = asyncio.get_running_loop().create_future()
        messages = [(5, b"m5"), (6, b"m6")]
        sub.put_changes(messages, b"u2")
        assert sub.waiter.done()
        # The same items again (a replay racing the live notification): only the count is new.
        sub.put_changes(messages, b"u2")
        assert sub.pending == [b"m5", b"m6", b"u2", b"u2"]

    asyncio.run(run())


@pytest.mark.pure
def test_a_stream_that_stops_reading_overflows_instead_of_buffering_without_bound() -> None:
    sub = stream.Subscriber(1)
    for k in range(stream.MAX_QUEUED):
        sub.put(b"%d" % k)
    assert not sub.overflow
    sub.put(b"one too many")
    assert sub.overflow and len(sub.pending) == stream.MAX_QUEUED


def _full_collections_while(hub: stream.Hub, seconds: float, busy: bool) -> tuple[tuple[int, int, int], int]:
    """Run the hub's collector for `seconds` (changes coming all along if `busy`); return the thresholds it set
    and how many full collections ran after its first one."""
    full: list[int] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(1)

    async def run() -> tuple[int, int, int]:
        collector = asyncio.create_task(hub._collect_garbage())
        await asyncio.sleep(0.02)
        during = gc.get_threshold()
        full.clear()
        end = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < end:
            if busy:
                hub._dispatch("1:2")
            await asyncio.sleep(0.005)
        collector.cancel()
        with pytest.raises(asyncio.CancelledError):
            await collector
        return during

    gc.callbacks.append(seen)
    try:
        during = asyncio.run(run())
    finally:
        gc.callbacks.remove(seen)
        gc.unfreeze()  # the hub freezes what the process holds; a test process must not keep that
    return during, len(full)


def test_the_hub_runs_the_full_collections_in_quiet_moments_only(monkeypatch: Any) -> None:
    monkeypatch.setattr(stream, "GC_TICK_SECONDS", 0.01)
    monkeypatch.setattr(stream, "GC_IDLE_EVERY_SECONDS", 0.0)
    monkeypatch.setattr(stream, "GC_IDLE_SECONDS", 0.05)
    before = gc.get_threshold()
    during, quiet = _full_collections_while(stream.Hub(), 0.3, busy=False)
    assert during == (before[0], before[1], stream._GC_NEVER)
    assert gc.get_threshold() == before  # given back when the collector stops
    assert quiet >= 1
    # Changes keep coming: no full collection until GC_LATEST_SECONDS, however long it has been due.
    assert _full_collections_while(stream.Hub(), 0.3, busy=True)[1] == 0
    monkeypatch.setattr(stream, "GC_LATEST_SECONDS", 0.1)
    assert _full_collections_while(stream.Hub(), 0.3, busy=True)[1] >= 1


@pytest.mark.pure
def test_a_quiet_hub_is_not_busy_and_a_change_makes_it_busy() -> None:
    hub = stream.Hub()
    assert not hub.busy()
    hub._dispatch("1:2")  # nobody of recipient 1 is connected here: nothing to push, but a change came
    assert hub.busy()


def test_every_lease_is_renewed_when_they_take_several_slices(settings: Any, monkeypatch: Any) -> None:
    settings.INBOX_STREAM_LEASE_SECONDS = 0.6  # renewed every 0.2 s
    monkeypatch.setattr(stream_limits, "RENEW_SLICE", 2)

    async def run() -> tuple[list[float], list[float], bool, list[int]]:
        limits = stream_limits.StreamLeases()
        token = f"renew-{uuid.uuid4().hex}"
        leases = []
        for recipient_id in range(900_000_001, 900_000_006):
            lease, verdict = await limits.acquire(token=f"{token}-{recipient_id}", recipient_id=recipient_id)
            assert verdict == stream_limits.OK and lease is not None
            leases.append(lease)
        redis = limits._redis()

        async def scores() -> list[tuple[float, float]]:
            return [
                (
                    (await redis.zscore(x.token_key, x.member)) or 0.0,
                    (await redis.zscore(x.recipient_key, x.member)) or 0.0,
                )
                for x in leases
            ]

        first = await scores()
        # A lease whose stream closed behind the renewer's back (its member gone, the stream still listed here)
        # is not brought back by a renewal.
        gone = leases[2]
        await redis.zrem(gone.token_key, gone.member)
        await asyncio.sleep(0.5)
        later = await scores()
        revived = await redis.zscore(gone.token_key, gone.member) is not None
        ttls = [await redis.pttl(x.recipient_key) for x in leases]
        for lease in leases:
            await limits.release(lease)
        assert limits._renewer is not None
        limits._renewer.cancel()
        token_moved = [b[0] - a[0] for a, b in zip(first, later, strict=True) if b[0]]
        recipient_moved = [b[1] - a[1] for a, b in zip(first, later, strict=True)]
        return token_moved, recipient_moved, revived, ttls

    token_moved, recipient_moved, revived, ttls = asyncio.run(run())
    assert len(token_moved) == 4 and all(moved > 0 for moved in token_moved)
    assert all(moved > 0 for moved in recipient_moved)
    assert not revived
    assert all(0 < ttl <= 2_000 for ttl in ttls)  # the sets expire a second after their leases
