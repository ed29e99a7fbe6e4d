"""core.group_commit: concurrent calls of one process written as groups, each answered with its own outcome."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from core.group_commit import GroupCommit


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
