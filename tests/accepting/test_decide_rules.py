"""What a recipient gets at accept, without services: channels, compliance, send time, frequency cap, fallback.

`recipient_decide` is the accept's decision for one recipient, whatever the request (a single, a group, a batch
item); it queries nothing for an uncapped category, so a query here fails the fast tier.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from hypothesis import assume, example, given
from hypothesis import strategies as st

from core.errors import ApiError
from notifier.accepting.decide import channels_decide, recipient_decide
from notifier.accepting.policy import PRIORITY_RANK, category_max_priority, send_policy
from notifier.clients.models import ApiClient
from notifier.deliveries import fallback, frequency
from notifier.deliveries.fallback import WAITING
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.planning import delivery_plan
from notifier.dispatch import localtime
from preferences.compliance import quiet_hours_end
from preferences.models import Recipient

pytestmark = pytest.mark.pure

UTC = dt.UTC
NOW = dt.datetime(2026, 3, 28, 21, 30, tzinfo=UTC)
CHANNELS = settings.CHANNELS
CATEGORIES = [*settings.NOTIFIER_CATEGORIES, "never-configured"]

times = st.times().map(lambda t: t.replace(microsecond=0))
# Around now, and around the nights the sample zones' clocks change (2026): spring forward and fall back.
CHANGES = [
    dt.datetime(2026, *day, tzinfo=UTC)
    for day in [(3, 8, 7), (3, 29, 1), (4, 4, 15), (10, 3, 16), (10, 25, 1), (11, 1, 6)]
]
instants = st.builds(
    lambda base, seconds: base + dt.timedelta(seconds=seconds),
    st.sampled_from([NOW, *CHANGES]),
    st.integers(min_value=-36 * 3600, max_value=36 * 3600),
)
zones = st.sampled_from(["", "UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu"])


# --- channels --------------------------------------------------------------------------------------------------


@given(st.none() | st.lists(st.sampled_from(CHANNELS), max_size=8), st.lists(st.sampled_from(CHANNELS), min_size=1))
def test_a_send_has_each_channel_once_in_the_order_asked_and_only_the_templates(
    requested: list[str] | None, template: list[str]
) -> None:
    template = list(dict.fromkeys(template))
    wanted = requested or template
    try:
        channels = channels_decide(requested, template, template_key="hello")
    except ApiError as exc:
        missing = [c for c in dict.fromkeys(wanted) if c not in template]
        assert missing and exc.status_code == 400 and ", ".join(missing) in str(exc.detail)
        return
    # A fallback chain is these channels in this order: it never repeats one.
    assert len(channels) == len(set(channels))
    assert channels == [c for i, c in enumerate(wanted) if c not in wanted[:i]]
    assert set(channels) <= set(template)


# --- category and priority -------------------------------------------------------------------------------------


@given(
    st.sampled_from(list(settings.NOTIFIER_CATEGORIES)),
    st.none() | st.sampled_from(CATEGORIES),
    st.none() | st.sampled_from(list(PRIORITY_RANK)),
    st.lists(st.sampled_from(CATEGORIES), max_size=3),
)
def test_the_template_decides_the_category_and_the_category_caps_the_priority(
    template_category: str, category: str | None, priority: str | None, allowed: list[str]
) -> None:
    client = ApiClient(name="svc", allowed_categories=allowed)
    try:
        decided, decided_priority = send_policy(
            client=client, template_category=template_category, category=category, priority=priority
        )
    except ApiError as exc:
        mismatch = bool(category) and category != template_category
        forbidden = bool(allowed) and template_category not in allowed
        assert mismatch or forbidden or priority is not None
        assert exc.status_code in (400, 403)
        return
    assert decided == template_category
    assert not allowed or decided in allowed
    assert PRIORITY_RANK[decided_priority] <= PRIORITY_RANK[category_max_priority(decided)]
    assert decided_priority == (priority or settings.NOTIFIER_CATEGORIES[decided]["priority"])


# --- compliance and send time ----------------------------------------------------------------------------------


@given(times, times, zones, instants)
# In New York's repeated hour (01:15 EST, the second one) a window of 01:00 to 01:30 ends at 01:30 EST, not at
# 01:30 EDT (an hour earlier, in the past).
@example(dt.time(1, 0), dt.time(1, 30), "America/New_York", dt.datetime(2026, 11, 1, 6, 15, tzinfo=UTC))
@example(dt.time(22, 0), dt.time(1, 30), "America/New_York", dt.datetime(2026, 11, 1, 6, 15, tzinfo=UTC))
def test_quiet_hours_end_at_the_next_time_the_recipients_clock_shows_their_end(
    start: dt.time, end: dt.time, name: str, now: dt.datetime
) -> None:
    zone = localtime.zone(name)
    until = quiet_hours_end(start=start, end=end, zone=zone, now=now)
    local = now.astimezone(zone).time()
    inside = start != end and (start <= local < end if start < end else (local >= start or local < end))
    assert (until is not None) == inside
    if until is None:
        return
    # Ahead of now, within a day (and a clock change), at the first moment after now that the recipient's clock
    # reaches the end of the window (a moment before, and at any moment between, it had not yet).
    assert now < until <= now + dt.timedelta(hours=26)
    assert until.utcoffset() == dt.timedelta(0)
    end_wall = dt.datetime.combine(_shown(until, zone).date(), end)
    assert _shown(until, zone) >= end_wall
    for k in range(8):
        assert _shown(now + (until - now) * k / 8, zone) < end_wall
    assert _shown(until - dt.timedelta(microseconds=1), zone) < end_wall


def _shown(instant: dt.datetime, zone: ZoneInfo) -> dt.datetime:
    """Return what a clock in `zone` shows at `instant` (naive)."""
    return instant.astimezone(zone).replace(tzinfo=None)


@st.composite
def recipients(draw: st.DrawFn) -> Recipient:
    """An unsaved recipient with any mix of the preferences compliance reads."""
    quiet = draw(st.none() | st.tuples(times, times))
    return Recipient(
        pk=draw(st.integers(min_value=1, max_value=5)),
        user_id="u-1",
        email="a@example.com",
        timezone=draw(zones),
        opted_out=draw(st.booleans()),
        erased_at=draw(st.none() | st.just(NOW)),
        channel_prefs=draw(st.dictionaries(st.sampled_from(CHANNELS), st.booleans(), max_size=2)),
        category_prefs=draw(
            st.dictionaries(
                st.sampled_from(CATEGORIES),
                st.fixed_dictionaries(
                    {},
                    optional={
                        "enabled": st.booleans(),
                        "channels": st.lists(st.sampled_from(CHANNELS), max_size=3),
                        "frequency": st.sampled_from(["immediate", "hourly_digest", "daily_digest"]),
                    },
                ),
                max_size=2,
            )
        ),
        quiet_start=quiet[0] if quiet else None,
        quiet_end=quiet[1] if quiet else None,
    )


@given(recipients(), st.sampled_from(CATEGORIES), st.sampled_from(CHANNELS), st.sampled_from(["", "x@example.com"]),
       st.none() | instants, st.booleans())  # fmt: skip
def test_a_new_delivery_never_waits_for_a_moment_already_past(
    recipient: Recipient, category: str, channel: str, address: str, send_at: dt.datetime | None, suppressed: bool
) -> None:
    plan = delivery_plan(
        recipient=recipient, category=category, channel=channel, address=address, send_at=send_at, now=NOW,
        suppressed=suppressed,
    )  # fmt: skip
    assert plan.status in ("queued", "scheduled", "deferred", "suppressed")
    assert plan.not_before is None or plan.not_before > NOW
    # Scheduled only for a send time ahead, and then exactly at it; never sent before it either.
    assert (plan.status == "scheduled") == (plan.reason == "" and send_at is not None and send_at > NOW)
    if plan.status == "scheduled":
        assert plan.not_before == send_at
    if plan.status == "queued":
        assert send_at is None or send_at <= NOW
    if plan.status == "deferred" and plan.not_before is not None and send_at is not None:
        assert plan.not_before >= send_at
    assert (plan.reason == "") == (plan.status in ("queued", "scheduled"))
    if suppressed and address:
        assert (plan.status, plan.reason) == ("suppressed", "suppressed")
    if not address:
        assert plan.status == "suppressed"


# --- one recipient's deliveries --------------------------------------------------------------------------------


@st.composite
def singles(draw: st.DrawFn) -> tuple[Notification, Recipient, list[tuple[str, str]], set[tuple[str, str]]]:
    """A decided single (unsaved), its recipient, its targets and which of them are on the suppression list."""
    channels = draw(st.lists(st.sampled_from(CHANNELS), min_size=1, max_size=5, unique=True))
    strategy = draw(st.sampled_from(fallback.STRATEGIES))
    data: dict[str, Any] = {"strategy": strategy}
    if strategy == fallback.FALLBACK:
        data["fallback_after_seconds"] = draw(st.none() | st.integers(min_value=1, max_value=3600))
    notification = Notification(
        channels=channels,
        category=draw(st.sampled_from(CATEGORIES)),
        priority="normal",
        send_at=draw(st.none() | instants),
        client=ApiClient(name="svc"),
        environment_id=1,
        **fallback.notification_fields(data),
    )
    targets = [
        (channel, draw(st.sampled_from(["", f"{channel}-a"])))
        for channel in channels
        for _ in range(draw(st.integers(min_value=1, max_value=2 if channel == "push" else 1)))
    ]
    dead = {target for target in targets if draw(st.booleans())}
    return notification, draw(recipients()), targets, dead


@given(singles())
def test_a_recipient_gets_one_delivery_per_target_at_most_one_step_at_a_time(
    single: tuple[Notification, Recipient, list[tuple[str, str]], set[tuple[str, str]]],
) -> None:
    notification, recipient, targets, dead = single
    assume(frequency.cap_of(notification.category) is None)  # a capped category asks its counter (Redis)
    deliveries = recipient_decide(notification, recipient, targets, NOW, dead=dead, capped=True)
    assert [(d.channel, d.address) for d in deliveries] == targets
    assert all(d.recipient is recipient and d.notification is notification for d in deliveries)
    assert all(d.not_before is None or d.not_before > NOW for d in deliveries)
    # Whatever compliance decided for a target stands; fallback only holds back what would have gone.
    planned = [
        delivery_plan(recipient=recipient, category=notification.category, channel=c, address=a,
                      send_at=notification.send_at, now=NOW, suppressed=(c, a) in dead)
        for c, a in targets
    ]  # fmt: skip
    for d, plan in zip(deliveries, planned, strict=True):
        if d.status != "pending":
            assert (d.status, d.reason, d.not_before) == (plan.status, plan.reason, plan.not_before)
        else:
            assert plan.status in WAITING and notification.strategy == fallback.FALLBACK
    going = {d.channel for d in deliveries if d.status in WAITING}
    if notification.strategy == fallback.FALLBACK:
        assert len(going) <= 1
    else:
        assert all(d.status != "pending" for d in deliveries)
    scheduled = notification.send_at is not None and notification.send_at > NOW
    assert (notification.status == Notification.Status.SCHEDULED) == scheduled


# --- frequency caps --------------------------------------------------------------------------------------------


@given(st.lists(st.sampled_from([str(s) for s in Delivery.Status]), max_size=6))
def test_a_refused_notification_suppresses_only_what_would_have_gone(statuses: list[str]) -> None:
    deliveries = [Delivery(channel="email", status=s, reason="r", not_before=NOW) for s in statuses]
    live = [d for d in deliveries if d.status in frequency.LIVE]
    frequency.refuse(live)
    for d, status in zip(deliveries, statuses, strict=True):
        if status in frequency.LIVE:
            assert (d.status, d.reason, d.not_before) == ("suppressed", frequency.REASON, None)
        else:
            assert (d.status, d.reason, d.not_before) == (status, "r", NOW)


def test_only_a_capped_notification_that_would_reach_its_recipient_counts(settings: Any) -> None:
    going = [Delivery(status="suppressed"), Delivery(status="queued"), Delivery(status="pending")]
    suppressed = [Delivery(status="suppressed"), Delivery(status="suppressed")]
    assert frequency.counted_at_accept("social", going) == []  # not capped
    settings.NOTIFIER_CATEGORIES = {
        **settings.NOTIFIER_CATEGORIES,
        "social": {**settings.NOTIFIER_CATEGORIES["social"], "frequency_cap": {"max": 3, "per_seconds": 86400}},
    }
    assert frequency.cap_of("social") == frequency.Cap(max=3, per_seconds=86400)
    assert frequency.counted_at_accept("social", going) == going[1:]
    assert frequency.counted_at_accept("social", suppressed) == []


@pytest.mark.parametrize(
    ("cap", "valid"),
    [
        ({"max": 3, "per_seconds": 60}, True),
        ({"max": 0, "per_seconds": 60}, False),
        ({"max": 3}, False),
        ({"max": "3", "per_seconds": 60}, False),
        ({"max": 3, "per_seconds": 60, "burst": 1}, False),
        ([3, 60], False),
    ],
)
def test_a_frequency_cap_is_two_positive_whole_numbers(cap: Any, valid: bool) -> None:
    assert (frequency.validate_caps({"social": {"frequency_cap": cap}}) == []) == valid
    assert frequency.validate_caps({"social": {}, "marketing": None}) == []
