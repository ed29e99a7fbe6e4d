"""Unread counts kept by a stream process: new items added without a count query, nothing counted twice."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

from notifier.inbox import unread
from notifier.inbox.services import inbox_item_mark_read
from notifier.inbox.tokens import inbox_token_mint
from notifier.inbox.unread import UnreadCounts
from preferences.models import Recipient
from tests.conftest import HandClock, wait_for
from tests.dispatch.test_fanout import make_topic, run_to_end
from tests.inbox.test_inbox_browser import SseReader, StreamServer
from tests.inbox.test_inbox_browser import stream_server as stream_server  # the fixture, shared
from tests.inbox.test_inbox_fanout import _accept, _client, _template


@pytest.mark.pure
def test_new_items_are_added_to_a_known_count_once() -> None:
    counts = UnreadCounts(HandClock())
    assert counts.added(7, [1]) is None  # unknown: the caller must read it
    assert counts.stored(7, 2, [], counts.begin()) == 2
    assert counts.added(7, [10, 11]) == 4
    assert counts.added(7, [11]) == 4  # the same item notified again
    assert counts.added(7, []) == 4
    counts.forget(7)
    assert not counts.known(7) and counts.added(7, [12]) is None


@pytest.mark.pure
def test_an_item_in_the_read_and_notified_after_it_is_not_counted_twice() -> None:
    clock = HandClock()
    counts = UnreadCounts(clock)
    # Item 5 committed before the read (so counted, and among its recent ids), its NOTIFY dispatched afterwards.
    assert counts.stored(3, 1, [5], counts.begin()) == 1
    clock.now += 1
    assert counts.added(3, [5]) == 1
    assert counts.added(3, [6]) == 2


@pytest.mark.pure
def test_items_added_while_a_read_was_under_way_survive_it_unless_it_saw_them() -> None:
    clock = HandClock()
    counts = UnreadCounts(clock)
    counts.stored(4, 0, [], counts.begin())
    started = counts.begin()
    clock.now += 0.5
    # Two new items arrive while a read (begun before) is in flight; the read saw item 21 but not item 22.
    assert counts.added(4, [21, 22]) == 2
    clock.now += 0.5
    assert counts.stored(4, 1, [21], started) == 2  # 1 counted by the read + 22, committed after its snapshot
    assert counts.added(4, [22]) == 2 and counts.added(4, [21]) == 2


@pytest.mark.pure
def test_an_older_read_does_not_replace_a_newer_one() -> None:
    clock = HandClock()
    counts = UnreadCounts(clock)
    older = counts.begin()
    clock.now += 1
    assert counts.stored(8, 5, [], counts.begin()) == 5
    assert counts.stored(8, 3, [], older) == 5


@pytest.mark.pure
def test_additions_older_than_the_window_are_forgotten(monkeypatch: Any) -> None:
    clock = HandClock()
    counts = UnreadCounts(clock)
    counts.stored(9, 0, [], counts.begin())
    counts.added(9, range(100))
    clock.now += unread.RECENT_SECONDS + 1
    assert counts.added(9, [1000]) == 101
    assert len(counts._entries[9].seen) == 1  # only the addition within the window is remembered


@pytest.mark.django_db(transaction=True)
def test_stream_counts_follow_new_items_reads_and_earlier_items(stream_server: Callable[..., StreamServer]) -> None:
    """Counts on the wire equal the database's: items before the stream, new topic items, one read between."""
    _template()
    topic = make_topic("unread", 2, prefix="u")
    people = list(Recipient.objects.filter(user_id__startswith="u-").order_by("id"))
    client = _client()
    before = _accept(client, topic.key)
    run_to_end(before)  # one unread item each before any stream opens
    server = stream_server()
    readers = [SseReader(server.port, inbox_token_mint(recipient=r, ttl_seconds=600)[0]) for r in people]

    def counts(reader: SseReader) -> list[int]:
        return [c["unread_count"] for c in reader.of("unread")]

    def last_is(reader: SseReader, count: int) -> bool:
        return counts(reader)[-1:] == [count]

    for reader in readers:
        wait_for(functools.partial(last_is, reader, 1), 20)
    for expected in (2, 3):
        run_to_end(_accept(client, topic.key))
        for reader in readers:
            wait_for(functools.partial(last_is, reader, expected), 20)
    # The first person reads the item that was there before the stream: a count-only change, read again.
    first_item = before.deliveries.get(recipient=people[0])
    assert inbox_item_mark_read(recipient=people[0], delivery_id=first_item.pk) is not None
    wait_for(functools.partial(last_is, readers[0], 2), 20)
    run_to_end(_accept(client, topic.key))
    wait_for(functools.partial(last_is, readers[0], 3), 20)
    wait_for(functools.partial(last_is, readers[1], 4), 20)
    # Every count a stream was told, in order: never one that the database did not hold at some moment.
    assert counts(readers[0]) == [1, 2, 3, 2, 3]
    assert counts(readers[1]) == [1, 2, 3, 4]
    for reader in readers:
        reader.close()
