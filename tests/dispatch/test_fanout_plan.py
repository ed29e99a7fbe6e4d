"""A fan-out page's plan without services: each subscriber is planned as accept plans a single to them.

`page_targets` and `page_plan` are the page's decisions (notifier/dispatch/fanout.py); reading the page, the
devices and the suppression list, and writing the rows, are the queries around them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.conf import settings
from hypothesis import given
from hypothesis import strategies as st

from notifier.accepting.decide import recipient_decide
from notifier.clients.models import ApiClient
from notifier.deliveries import fallback
from notifier.deliveries.models import Notification
from notifier.dispatch import localtime
from notifier.dispatch.fanout import _Row, page_plan, page_targets
from preferences.models import Recipient

pytestmark = pytest.mark.pure

UTC = dt.UTC
NOW = dt.datetime(2026, 10, 24, 22, 0, tzinfo=UTC)
CHANNELS = ["push", "email", "sms", "inapp", "webhook"]
CATEGORIES = [c for c in settings.NOTIFIER_CATEGORIES if not settings.NOTIFIER_CATEGORIES[c].get("frequency_cap")]
zones = st.sampled_from(["", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Pacific/Chatham"])
times = st.times().map(lambda t: t.replace(second=0, microsecond=0))


@st.composite
def subscribers(draw: st.DrawFn, pk: int) -> _Row:
    """A page row of one subscriber (subscriber_page's columns after the subscription id)."""
    quiet = draw(st.none() | st.tuples(times, times))
    return _Row(
        (
            pk,
            f"u-{pk}",
            draw(st.sampled_from(["", f"u{pk}@example.com"])),
            draw(st.sampled_from(["", "+4915112345678"])),
            draw(st.sampled_from(["", "https://hooks.example.com/own"])),
            draw(zones),
            draw(st.booleans()),
            draw(st.sampled_from(["{}", '{"sms": false}', '{"email": false, "push": true}'])),
            draw(st.sampled_from(["{}", '{"marketing": {"enabled": false}}', '{"social": {"channels": ["inapp"]}}'])),
            quiet[0] if quiet else None,
            quiet[1] if quiet else None,
            None,
            "",
            "{}",
        )
    )


@st.composite
def pages(draw: st.DrawFn) -> tuple[Notification, list[_Row], dict[int, list[str]], str]:
    """A topic notification, a page of its subscribers, their push tokens and the campaign's zone."""
    channels = draw(st.lists(st.sampled_from(CHANNELS), min_size=1, max_size=4, unique=True))
    strategy = draw(st.sampled_from(fallback.STRATEGIES))
    local = draw(st.none() | st.integers(min_value=-48, max_value=48).map(lambda h: NOW + dt.timedelta(hours=h)))
    notification = Notification(
        channels=channels,
        category=draw(st.sampled_from(CATEGORIES)),
        priority="normal",
        send_at=None if local else draw(st.none() | st.just(NOW + dt.timedelta(hours=1))),
        send_at_local=local.replace(tzinfo=None).isoformat() if local else "",
        client=ApiClient(name="svc", webhook_url="https://hooks.example.com/client"),
        environment_id=1,
        **fallback.notification_fields({"strategy": strategy, "fallback_after_seconds": 120}),
    )
    rows = [draw(subscribers(pk)) for pk in range(1, draw(st.integers(min_value=1, max_value=6)) + 1)]
    devices = {r.pk: [f"tok-{r.pk}-{i}" for i in range(draw(st.integers(0, 2)))] for r in rows}
    return notification, rows, devices, draw(st.sampled_from(["", "Asia/Tokyo"]))


@given(pages())
def test_a_page_targets_every_address_of_each_subscriber_on_each_channel(page: tuple[Any, ...]) -> None:
    notification, rows, devices, _ = page
    targets = page_targets(notification, rows, devices)
    expected = []
    for r in rows:
        for channel in notification.channels:
            if channel == "push":
                expected += [(r, channel, token) for token in devices[r.pk] or [""]]
            elif channel == "webhook":
                expected.append((r, channel, r.webhook_url or notification.client.webhook_url))
            else:
                expected.append((r, channel, {"email": r.email, "sms": r.phone, "inapp": r.user_id}[channel]))
    assert targets == expected


@given(pages(), st.data())
def test_each_subscriber_is_planned_as_a_single_to_them_at_their_local_time(page: tuple[Any, ...], data: Any) -> None:
    notification, rows, devices, zone = page
    targets = page_targets(notification, rows, devices)
    dead = {(c, a) for _, c, a in targets if a and data.draw(st.booleans())}
    planned = page_plan(notification, targets, NOW, dead=dead, fallback_zone=zone)
    assert [row[:3] for row in planned] == [(r.pk, c, a) for r, c, a in targets]
    assert all(row[5] is None or row[5] > NOW for row in planned)
    for r in rows:
        # The single accept would make for this subscriber: its send_at_local read in their zone (else the zone
        # the campaign names), the same compliance, the same fallback chain.
        single = Notification(
            channels=notification.channels,
            category=notification.category,
            priority=notification.priority,
            send_at=localtime.send_at_for(notification, r.timezone or zone),
            client=notification.client,
            environment_id=1,
            strategy=notification.strategy,
            fallback_until=notification.fallback_until,
            fallback_after_seconds=notification.fallback_after_seconds,
        )
        mine = [(c, a) for s, c, a in targets if s is r]
        decided = recipient_decide(single, _recipient(r), mine, NOW, dead=dead, capped=False)
        assert [row[3:] for row in planned if row[0] == r.pk] == [(d.status, d.reason, d.not_before) for d in decided]


def _recipient(row: _Row) -> Recipient:
    """Return the Recipient a page row stands for (what a single's accept reads)."""
    return Recipient(**{name: getattr(row, name) for name in _Row.__slots__})


@given(pages(), st.integers(min_value=1, max_value=5))
def test_where_a_page_ends_changes_no_subscribers_plan(page: tuple[Any, ...], cut: int) -> None:
    notification, rows, devices, zone = page
    whole = page_plan(notification, page_targets(notification, rows, devices), NOW, dead=set(), fallback_zone=zone)
    parts = [
        row
        for part in (rows[:cut], rows[cut:])
        for row in page_plan(
            notification, page_targets(notification, part, devices), NOW, dead=set(), fallback_zone=zone
        )
    ]
    assert parts == whole
