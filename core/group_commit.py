"""Group commit: concurrent calls of one process share one writer and one write.

A thread hands its work to `GroupCommit.submit` and waits for its own outcome. When no write is in progress,
it writes at once, alone (a lone call waits for nobody: no timer, no window). When one is in progress, it
queues; the thread that finishes a write passes the turn to the first one waiting, which takes everything
queued by then (up to `max_size`) and writes it with one call of `write_group`. Every call gets its own
outcome (a result, or the exception it raised), set by whoever wrote it; `write_group` is what decides that
one call's failure is not its neighbours'.

With `max_wait`, a call that has waited that long without being taken into a write starts a write of its own
beside the one in flight (taking what waits with it): a write that hangs (a send batch held open by one slow
receiver) delays the calls behind it by `max_wait` at most, not by as long as it hangs.

Two writers use it: the API's single accepts share a transaction and a commit
(notifier.accepting.services.notifications_accept_group), and a send worker's small send tasks of one queue
share a batch (channels_app.tasks). The writer is always one of the waiting threads, never a thread of its
own: the work runs on that thread's database connection (and, for a send, its task's context), so grouping
opens no connection beyond the threads that were already there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

W = TypeVar("W")  # one call's work
R = TypeVar("R")  # one call's result


class _Waiter(Generic[W, R]):
    __slots__ = ("done", "error", "result", "taken", "turn", "work", "writes")

    def __init__(self, work: W) -> None:
        self.work = work
        self.result: R | None = None
        self.error: BaseException | None = None
        self.done = False
        # Under the lock: `writes` once this thread is to write (it leads, is handed the turn, or waited too
        # long), `taken` once its work is in a group being written. Neither: it is in the waiting list.
        self.writes = False
        self.taken = False
        # Set when this call's outcome is known or when it is this thread's turn to write.
        self.turn = threading.Event()


class GroupCommit(Generic[W, R]):
    """Run concurrent calls of one process as groups: one call of `write_group` per group of waiting calls.

    `write_one(work)` writes a call that is alone (the common case at low load); `write_group(works)` writes
    two or more, the writing thread's own work first, and returns one outcome per work, in order: a result or
    an exception instance.
    """

    def __init__(
        self,
        *,
        write_one: Callable[[W], R],
        write_group: Callable[[Sequence[W]], Sequence[R | BaseException]],
        max_size: int = 64,
        max_wait: float | None = None,
    ) -> None:
        self._write_one = write_one
        self._write_group = write_group
        self.max_size = max(1, max_size)
        self.max_wait = max_wait
        self._lock = threading.Lock()
        self._waiting: list[_Waiter[W, R]] = []  # neither writing nor taken, in arrival order
        self._writers = 0
        # Observability and tests: how many groups of more than one were written, the largest one, and how many
        # writes started beside one in flight because a call had waited `max_wait`.
        self.groups = 0
        self.largest = 0
        self.beside = 0

    def pending(self) -> int:
        """Return how many calls wait for a writer right now."""
        with self._lock:
            return len(self._waiting)

    def submit(self, work: W) -> R:
        """Write `work` (alone or with the others waiting) and return its result, or raise its own error."""
        me: _Waiter[W, R] = _Waiter(work)
        with self._lock:
            if self._writers == 0:
                self._writers = 1
                me.writes = True
            else:
                self._waiting.append(me)
        if not me.writes and not me.turn.wait(self.max_wait):
            with self._lock:
                if not me.writes and not me.taken:
                    # The write in flight has held this call for max_wait: write beside it.
                    self._waiting.remove(me)
                    self._writers += 1
                    self.beside += 1
                    me.writes = True
        if me.writes:
            self._write_turn(me)
        else:
            me.turn.wait()  # taken into another thread's group: its outcome is coming
        if me.error is not None:
            raise me.error
        return me.result  # type: ignore[return-value]  # done without an error: the writer set a result

    def _write_turn(self, me: _Waiter[W, R]) -> None:
        """Take what waits behind this thread's own work, write it, answer each, pass the turn on."""
        with self._lock:
            group = [me, *self._waiting[: self.max_size - 1]]
            del self._waiting[: self.max_size - 1]
            for waiter in group:
                waiter.taken = True
        try:
            if len(group) == 1:
                outcomes: Sequence[Any] = [self._call_one(group[0].work)]
            else:
                outcomes = self._write_group([w.work for w in group])
                if len(outcomes) != len(group):
                    raise RuntimeError(f"group writer answered {len(outcomes)} of {len(group)} calls")
                self.groups += 1
                self.largest = max(self.largest, len(group))
        except BaseException as exc:  # every waiter must be answered, whatever happened
            outcomes = [exc] * len(group)
        for waiter, outcome in zip(group, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                waiter.error = outcome
            else:
                waiter.result = outcome
            waiter.done = True
        with self._lock:
            following = self._waiting.pop(0) if self._waiting else None
            if following is None:
                self._writers -= 1
            else:
                following.writes = True  # the turn passes on: the number of writers stays the same
        for waiter in group:
            waiter.turn.set()
        if following is not None:
            following.turn.set()  # its turn: it writes everything queued by now

    def _call_one(self, work: W) -> R | BaseException:
        try:
            return self._write_one(work)
        except Exception as exc:  # the call's own error, raised in its own thread
            return exc
