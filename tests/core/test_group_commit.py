"""core.group_commit: concurrent calls of one process written as groups, each answered with its own outcome."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from core.group_commit import GroupCommit

pytestmark = pytest.mark.pure


def test_calls_made_while_one_writes_are_written_as_one_group_the_writers_own_work_first() -> None:
    """A call alone writes at once; the calls that arrive meanwhile are the next group, led by one of them."""
    holding = threading.Event()
    release = threading.Event()
    groups: list[tuple[str, list[int]]] = []

    def write_one(work: int) -> int:
        groups.append((threading.current_thread().name, [work]))
        if work == 0:
            holding.set()
            release.wait(10)
        if work == 13:
            raise ValueError("thirteen")
        return work * 10

    def write_group(works: Sequence[int]) -> list[int | BaseException]:
        groups.append((threading.current_thread().name, list(works)))
        return [ValueError("thirteen") if w == 13 else w * 10 for w in works]

    group = GroupCommit(write_one=write_one, write_group=write_group, max_size=8)
    outcomes: dict[int, object] = {}

    def call(work: int) -> None:
        try:
            outcomes[work] = group.submit(work)
        except ValueError as exc:
            outcomes[work] = exc

    threads = [threading.Thread(target=call, args=(0,), name="t0")]
    threads[0].start()
    assert holding.wait(10)
    for work in (11, 12, 13):
        threads.append(threading.Thread(target=call, args=(work,), name=f"t{work}"))
        threads[-1].start()
    while group.pending() < 3:
        threading.Event().wait(0.01)
    release.set()
    for thread in threads:
        thread.join(10)

    assert groups[0] == ("t0", [0])
    writer, works = groups[1]
    assert sorted(works) == [11, 12, 13]
    assert writer == f"t{works[0]}"  # the thread that writes a group leads it with its own work
    assert outcomes[0] == 0 and outcomes[11] == 110 and outcomes[12] == 120
    assert isinstance(outcomes[13], ValueError)  # its own error, and only its own
    assert (group.groups, group.largest) == (1, 3)
    # Alone again: written at once, by itself.
    assert group.submit(5) == 50 and groups[-1][1] == [5]


def test_a_group_writer_that_raises_answers_every_call_of_its_group_with_the_error() -> None:
    release = threading.Event()
    holding = threading.Event()

    def write_one(work: int) -> int:
        holding.set()
        release.wait(10)
        return work

    def write_group(works: Sequence[int]) -> list[int | BaseException]:
        raise RuntimeError("the group's commit failed")

    group = GroupCommit(write_one=write_one, write_group=write_group)
    errors: list[str] = []

    def call(work: int) -> None:
        try:
            group.submit(work)
        except RuntimeError as exc:
            errors.append(str(exc))

    first = threading.Thread(target=call, args=(1,))
    first.start()
    assert holding.wait(10)
    others = [threading.Thread(target=call, args=(w,)) for w in (2, 3)]
    for thread in others:
        thread.start()
    while group.pending() < 2:
        threading.Event().wait(0.01)
    release.set()
    for thread in (first, *others):
        thread.join(10)
    assert errors == ["the group's commit failed"] * 2


def test_calls_held_past_max_wait_by_a_hanging_write_are_written_beside_it_and_the_turns_add_up() -> None:
    """A write that hangs holds the calls behind it for `max_wait` only: they write beside it, as a group.

    Without `max_wait` they would wait for as long as the first write hangs (here until the test lets it go).
    """
    hanging = threading.Event()
    release = threading.Event()
    groups: list[list[int]] = []

    def write_one(work: int) -> int:
        groups.append([work])
        if work == 0:
            hanging.set()
            release.wait(30)
        return work

    def write_group(works: Sequence[int]) -> list[int | BaseException]:
        groups.append(list(works))
        return list(works)

    group = GroupCommit(write_one=write_one, write_group=write_group, max_wait=0.2)
    answered: dict[int, int] = {}
    arrived = threading.Barrier(4)

    def call(work: int) -> None:
        if work:
            arrived.wait(10)
        answered[work] = group.submit(work)

    hung = threading.Thread(target=call, args=(0,))
    hung.start()
    assert hanging.wait(10)
    others = [threading.Thread(target=call, args=(w,)) for w in (1, 2, 3, 4)]
    try:
        for thread in others:
            thread.start()
        for thread in others:
            thread.join(10)
        # Answered while the first write still hangs.
        assert not release.is_set() and hung.is_alive()
        assert answered == {1: 1, 2: 2, 3: 3, 4: 4}
        assert group.beside >= 1
        assert sorted(w for g in groups[1:] for w in g) == [1, 2, 3, 4]  # each written once
        assert len(groups) - 1 < 4  # and not one by one: the late ones went together
    finally:
        release.set()
        hung.join(10)
    assert answered[0] == 0
    # Every writer gave its turn back: a call alone writes at once again, by itself.
    assert group.pending() == 0
    assert group.submit(9) == 9 and groups[-1] == [9]


def test_without_max_wait_calls_wait_for_the_write_in_flight() -> None:
    """The API's group commit sets no `max_wait`: a call behind a write waits for it, however long."""
    release = threading.Event()
    holding = threading.Event()

    def write_one(work: int) -> int:
        if work == 0:
            holding.set()
            release.wait(10)
        return work

    group = GroupCommit(write_one=write_one, write_group=lambda works: list(works))
    first = threading.Thread(target=group.submit, args=(0,))
    first.start()
    assert holding.wait(10)
    answered: list[int] = []
    second = threading.Thread(target=lambda: answered.append(group.submit(1)))
    second.start()
    second.join(0.5)
    assert second.is_alive() and answered == [] and group.pending() == 1
    release.set()
    for thread in (first, second):
        thread.join(10)
    assert answered == [1] and group.beside == 0
