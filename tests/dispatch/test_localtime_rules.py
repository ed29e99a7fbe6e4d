"""Local send times without services: a wall-clock time in any zone, on any day, including the nights clocks change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from notifier.deliveries.models import Notification
from notifier.dispatch.localtime import local_instant, send_at_for, send_time, zone

pytestmark = pytest.mark.pure

walls = st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2037, 12, 31))
zones = st.timezone_keys()
EARLIER = [
    timedelta(microseconds=1),
    timedelta(seconds=1),
    timedelta(minutes=30),
    timedelta(hours=1),
    timedelta(hours=2),
]


def _shown(instant: datetime, name: str) -> datetime:
    """Return what a clock in zone `name` shows at `instant` (naive)."""
    return instant.astimezone(ZoneInfo(name)).replace(tzinfo=None)


@given(walls, zones)
@example(datetime(2026, 3, 8, 2, 30), "America/New_York")  # in the spring-forward gap
@example(datetime(2026, 11, 1, 1, 30), "America/New_York")  # in the autumn overlap
@example(datetime(2011, 12, 30, 12, 0), "Pacific/Apia")  # a day the zone skipped
def test_a_local_send_time_is_the_first_instant_the_recipients_clock_shows_it(wall: datetime, name: str) -> None:
    instant = local_instant(wall, name)
    assert instant.utcoffset() == timedelta(0)
    # Never early: the recipient's clock shows the time asked for (or, in a gap, the first time after it) ...
    assert _shown(instant, name) >= wall
    # ... and never late: at no moment before did it show that time or a later one (in an overlap, the later
    # of the two occurrences is an hour late; in a gap, any time after the jump is late).
    for before in EARLIER:
        assert _shown(instant - before, name) < wall
    # A time that exists is met exactly (the first of two in an overlap).
    exists = _shown(wall.replace(tzinfo=ZoneInfo(name), fold=0).astimezone(UTC), name) == wall
    if exists:
        assert _shown(instant, name) == wall


@given(walls, st.sampled_from(["", "Not/AZone", "..", "UTC"]))
def test_a_recipient_without_a_known_zone_gets_utc(wall: datetime, name: str) -> None:
    assert zone(name) == ZoneInfo("UTC")
    assert local_instant(wall, name) == wall.replace(tzinfo=UTC)


@given(walls, zones, zones)
def test_the_same_wall_clock_time_is_reached_in_each_zone_at_its_own_instant(wall: datetime, a: str, b: str) -> None:
    notification = Notification(send_at_local=wall.isoformat())
    first, second = send_at_for(notification, a), send_at_for(notification, b)
    assert first == local_instant(wall, a) and second == local_instant(wall, b)
    # Zones are at most 26 hours apart (UTC-12 to UTC+14), and a gap moves a time later by its length.
    assert abs(first - second) <= timedelta(hours=26) + timedelta(days=1)


@given(st.none() | walls.map(lambda w: w.replace(tzinfo=UTC)), zones)
def test_without_a_local_time_the_send_at_is_kept(send_at: datetime | None, name: str) -> None:
    assert send_at_for(Notification(send_at=send_at, send_at_local=""), name) == send_at
    assert send_time(None, name) is None
