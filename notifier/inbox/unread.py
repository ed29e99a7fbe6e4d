"""The unread counts a stream process keeps for its connected recipients, so a burst of new items asks no count.

A topic's in-app message reaches every connected recipient as a NOTIFY of its new item, and each stream shows
the item and the recipient's new unread count. Counting in the database for every recipient of a burst was most
of the database's work in a round (10,000 recipients' counts over every partition of the delivery log), and it
grows with each recipient's inbox. A new stored item can only add one: it is `sent` and unread when it is
notified (its NOTIFY is sent in the statement that stores it, notifier.statusevents.record), and the status
writer makes a delivery `sent` once. So the process reads a recipient's count when it first needs it (a stream
opens) and whenever a change other than a new item comes (an item read, all read: those arrive as count-only
changes), and adds each new item to it in between.

The one trap is an item counted twice: committed before a count was read, so in it, but notified after it. A
read therefore also returns the ids of the recipient's unread items sent in the last RECENT_SECONDS, and an
item is added only if neither that read nor an earlier addition saw it. An item whose NOTIFY lags its commit by
more than RECENT_SECONDS (far past anything a working listener shows) could be counted twice; the next
count-only change, a reconnect of the LISTEN connection or a new stream of the recipient reads the count again.
Changes that nobody notifies (an erasure, old partitions archived) also show at the next read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# How far back a count's read reports the ids of the unread items it counted; also how long additions are
# remembered.
RECENT_SECONDS = 300.0


@dataclass(slots=True)
class _Entry:
    value: int
    # Unread items known to be in `value` and sent lately: those the read reported, and those added since.
    seen: dict[int, float] = field(default_factory=dict)
    # When the read that gave `value` began (the clock of UnreadCounts).
    read_started: float = 0.0


class UnreadCounts:
    """Unread counts by recipient: stored from database reads, moved on by new items in between."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[int, _Entry] = {}

    def begin(self) -> float:
        """Return the stamp of a read about to start: pass it to `stored` with the read's result."""
        return self._clock()

    def known(self, recipient_id: int) -> bool:
        """Return whether new items of this recipient can be added without asking the database."""
        return recipient_id in self._entries

    def stored(self, recipient_id: int, count: int, recent_ids: Iterable[int], started: float) -> int:
        """Record a count read from the database, begun at `started`; return the recipient's count now.

        Items added while the read was under way and not among its recent ids were committed after its snapshot:
        they are added to it. A read older than the one stored is not stored (its count is still answered from
        the newer one).
        """
        now = self._clock()
        recent = set(recent_ids)
        old = self._entries.get(recipient_id)
        if old is not None and old.read_started > started:
            return old.value
        seen = dict.fromkeys(recent, now)
        late = 0
        if old is not None:
            for item_id, at in old.seen.items():
                if item_id in recent or now - at > RECENT_SECONDS:
                    continue
                seen[item_id] = at
                if at >= started:
                    late += 1
        entry = self._entries[recipient_id] = _Entry(value=int(count) + late, seen=seen, read_started=started)
        return entry.value

    def added(self, recipient_id: int, item_ids: Iterable[int]) -> int | None:
        """Add a burst's new unread items to a known count and return it; None if the count must be read."""
        entry = self._entries.get(recipient_id)
        if entry is None:
            return None
        now = self._clock()
        seen = entry.seen
        for item_id in item_ids:
            if item_id not in seen:
                seen[item_id] = now
                entry.value += 1
        if len(seen) > 64:
            # Forget what is too old to be notified again, so a busy inbox does not grow this without bound.
            entry.seen = {i: at for i, at in seen.items() if now - at <= RECENT_SECONDS}
        return entry.value

    def forget(self, recipient_id: int) -> None:
        """Drop a recipient whose last stream in this process closed."""
        self._entries.pop(recipient_id, None)
