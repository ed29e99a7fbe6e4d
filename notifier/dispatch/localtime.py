"""The recipient's local time: turn a wall-clock time ("09:00 on 1 December") into an instant in their time zone.

Two wall-clock times need a rule, because daylight saving time makes local time skip or repeat:

- **Gap** (clocks jump forward: 02:30 does not exist in New York on 8 March 2026): the message goes at the
  first valid instant after the requested time, which is the moment the clocks jump (03:00 local, 07:00 UTC).
  Sending an hour late (03:30) or an hour early would both be further from what was asked.
- **Overlap** (clocks go back: 01:30 happens twice in New York on 1 November 2026): the first occurrence
  (01:30 EDT, 05:30 UTC). It is the earlier of the two, so a message never arrives later than it could.

A recipient without a time zone (or with one the zone database does not know) is treated as UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

if TYPE_CHECKING:  # types only: the models import the apps this module must not load
    from notifier.deliveries.models import Notification
    from preferences.models import Recipient

DEFAULT_ZONE = "UTC"


def zone(name: str | None) -> ZoneInfo:
    """Return the time zone called `name`, or UTC for an empty or unknown name."""
    try:
        return ZoneInfo(name or DEFAULT_ZONE)
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo(DEFAULT_ZONE)


def is_zone(name: str) -> bool:
    """Return whether `name` is a time zone of the IANA database (e.g. "Europe/Berlin")."""
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def parse_wall_clock(value: str) -> datetime:
    """Parse an ISO 8601 date and time without an offset ("2026-12-01T09:00:00"); raise ValueError otherwise."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is not None:
        raise ValueError("Give a local date and time without an offset (e.g. 2026-12-01T09:00:00).")
    return parsed


def _wall(instant: datetime, tz: ZoneInfo) -> datetime:
    return instant.astimezone(tz).replace(tzinfo=None)


def local_instant(wall: datetime, tz_name: str | None) -> datetime:
    """Return the UTC instant at which it is `wall` (naive) in time zone `tz_name`, by the rules above."""
    tz = zone(tz_name)
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if _wall(first, tz) == wall:
        return first  # exists; in an overlap fold=0 is the first occurrence
    # In a gap: fold=0 reads the wall time with the offset before the jump (an instant after the gap starts),
    # fold=1 with the offset after it (an instant before). The jump lies between: find it to the second.
    low = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    high = first
    if low > high:
        low, high = high, low
    while high - low > timedelta(seconds=1):
        mid = low + (high - low) / 2
        if _wall(mid, tz) >= wall:
            high = mid
        else:
            low = mid
    return high.replace(microsecond=0) if _wall(high.replace(microsecond=0), tz) >= wall else high


def send_time(wall: datetime | None, tz_name: str | None) -> datetime | None:
    """Return the instant to send a `send_at_local` message to a recipient in `tz_name` (None without one)."""
    return local_instant(wall, tz_name) if wall is not None else None


def wall_clock_of(notification: object) -> datetime | None:
    """Return a notification's `send_at_local` as a naive datetime, or None."""
    value = getattr(notification, "send_at_local", "")
    return parse_wall_clock(value) if value else None


def send_at_for(notification: object, tz_name: str | None) -> datetime | None:
    """Return when a notification goes to a recipient in `tz_name`: its send_at_local there, else its send_at."""
    wall = wall_clock_of(notification)
    if wall is None:
        return getattr(notification, "send_at", None)
    return local_instant(wall, tz_name)


def apply_to_single(notification: Notification, recipient: Recipient) -> None:
    """Give a single-recipient notification with `send_at_local` the send_at of its recipient's time zone."""
    wall = wall_clock_of(notification)
    if wall is not None:
        notification.send_at = local_instant(wall, getattr(recipient, "timezone", ""))
