"""Fallback rules without services: which step of a chain starts at accept, and what each decision moves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from hypothesis import given
from hypothesis import strategies as st

from notifier.deliveries import fallback
from notifier.deliveries.fallback import GAVE_UP, REACHED, WAITING, Decisions, plan_steps
from notifier.deliveries.models import Delivery, Notification

pytestmark = pytest.mark.pure

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
# What planning gives a new delivery (planning.delivery_plan): fallback sees these at accept and at fan-out.
PLANNED = ("queued", "scheduled", "deferred", "suppressed")
# Every status a delivery of a chain can be in when a decision is made.
ANY_STATUS = tuple(str(s) for s in Delivery.Status)

chains = st.lists(st.sampled_from(settings.CHANNELS), min_size=1, max_size=5, unique=True)
maybe_time = st.none() | st.integers(min_value=-3600, max_value=86400).map(lambda s: NOW + timedelta(seconds=s))


@st.composite
def accepted(draw: st.DrawFn) -> tuple[list[str], list[tuple[str, str, datetime | None]]]:
    """A chain and one recipient's planned deliveries on it (a channel may have several addresses: push)."""
    channels = draw(chains)
    items = []
    for channel in channels:
        for _ in range(draw(st.integers(min_value=0, max_value=2))):
            status = draw(st.sampled_from(PLANNED))
            items.append((channel, status, None if status == "suppressed" else draw(maybe_time)))
    return channels, draw(st.permutations(items))


def _apply(items: list[tuple[str, str, datetime | None]], changes: list[Any]) -> list[tuple[str, str, Any]]:
    return [
        item if change is None else (item[0], change[0], change[2]) for item, change in zip(items, changes, strict=True)
    ]


@given(accepted(), st.integers(min_value=1, max_value=fallback.MAX_AFTER_SECONDS))
def test_a_chain_starts_with_one_step_and_gives_only_the_next_one_a_deadline(
    chain: tuple[list[str], list[tuple[str, str, datetime | None]]], seconds: int
) -> None:
    channels, items = chain
    wait = timedelta(seconds=seconds)
    changes = plan_steps(channels, items, start=NOW, wait=wait)
    assert len(changes) == len(items)
    after = _apply(items, changes)

    live_steps = sorted({channels.index(ch) for ch, status, _ in items if status in WAITING})
    for (channel, status, _), change in zip(items, changes, strict=True):
        if change is None:
            continue
        # Only a delivery that would have gone is held, and only on a later step than the first live one.
        assert status in WAITING and channels.index(channel) > live_steps[0]
        assert change[:2] == ("pending", fallback.REASON)
    # Whatever planning suppressed stays as it was.
    assert all(a == i for i, a in zip(items, after, strict=True) if i[1] not in WAITING)
    # At most one step goes out: every delivery still waiting to go is on the first live step, unchanged.
    going = {channels.index(ch) for ch, status, _ in after if status in WAITING}
    assert going == set(live_steps[:1])
    first_step = [i for i in items if live_steps and channels.index(i[0]) == live_steps[0]]
    assert first_step == [a for a in after if live_steps and channels.index(a[0]) == live_steps[0]]
    # Only the next live step has a deadline: its wait after the first step is due, never before now.
    timed = [a for a in after if a[1] == "pending" and a[2] is not None]
    assert {channels.index(a[0]) for a in timed} == set(live_steps[1:2])
    due = [nb for ch, _, nb in first_step if nb is not None]
    for _, _, deadline in timed:
        assert deadline == max([NOW, *due]) + wait
        assert deadline > NOW


@given(accepted())
def test_the_all_strategy_plans_nothing(chain: tuple[list[str], list[tuple[str, str, datetime | None]]]) -> None:
    channels, items = chain
    notification = Notification(channels=channels, strategy=fallback.ALL)
    deliveries = [Delivery(channel=ch, status=status, not_before=nb) for ch, status, nb in items]
    fallback.plan_at_accept(notification, deliveries, NOW)
    assert [(d.channel, d.status, d.not_before) for d in deliveries] == items


@given(accepted(), st.integers(min_value=1, max_value=3600), maybe_time)
def test_a_single_is_planned_as_its_items_are(
    chain: tuple[list[str], list[tuple[str, str, datetime | None]]], seconds: int, send_at: datetime | None
) -> None:
    channels, items = chain
    notification = Notification(
        channels=channels, strategy=fallback.FALLBACK, fallback_after_seconds=seconds, send_at=send_at
    )
    deliveries = [Delivery(channel=ch, status=status, not_before=nb) for ch, status, nb in items]
    fallback.plan_at_accept(notification, deliveries, NOW)
    start = max(NOW, send_at) if send_at else NOW
    expected = _apply(items, plan_steps(channels, items, start=start, wait=timedelta(seconds=seconds)))
    assert [(d.channel, d.status, d.not_before) for d in deliveries] == expected


@given(
    chains.flatmap(
        lambda ch: st.tuples(
            st.just(ch),
            st.lists(
                st.tuples(st.integers(1, 4), st.sampled_from(ch), st.sampled_from(PLANNED[:3]), maybe_time), max_size=12
            ),
        )
    )
)
def test_a_page_is_planned_per_recipient_whatever_the_order_of_its_rows(chain: tuple[list[str], list[Any]]) -> None:
    channels, drawn = chain
    notification = Notification(channels=channels, strategy=fallback.FALLBACK, fallback_after_seconds=60)
    rows = [(rid, ch, f"{ch}-{i}", status, "", nb) for i, (rid, ch, status, nb) in enumerate(drawn)]
    planned = fallback.plan_fanout_rows(notification, rows, NOW)
    assert [r[:3] for r in planned] == [r[:3] for r in rows]
    for rid in {r[0] for r in rows}:
        mine = [i for i, r in enumerate(rows) if r[0] == rid]
        deliveries = [Delivery(channel=rows[i][1], status=rows[i][3], not_before=rows[i][5]) for i in mine]
        fallback.plan_at_accept(notification, deliveries, NOW)
        assert [(d.status, d.not_before) for d in deliveries] == [(planned[i][3], planned[i][5]) for i in mine]
    # Another order of the page's rows changes no row's plan.
    reordered = fallback.plan_fanout_rows(notification, rows[::-1], NOW)
    assert reordered[::-1] == planned


def test_notification_fields_fill_in_the_defaults_of_fallback_only() -> None:
    assert fallback.notification_fields({"strategy": "all"}) == {}
    assert fallback.notification_fields({}) == {}
    assert fallback.notification_fields({"strategy": "fallback"}) == {
        "strategy": "fallback",
        "fallback_until": fallback.DEFAULT_UNTIL,
        "fallback_after_seconds": fallback.DEFAULT_AFTER_SECONDS,
    }
    asked = {"strategy": "fallback", "fallback_until": "opened", "fallback_after_seconds": 30}
    assert fallback.notification_fields(asked) == asked


def test_a_chain_starting_past_its_first_channel_says_why() -> None:
    rows = [(1, "push", "suppressed", "no_address"), (2, "email", "suppressed", "opted_out"), (3, "sms", "queued", "")]
    assert fallback._start_events(["push", "email", "sms"], rows) == [
        (3, "queued", "fallback: email suppressed (opted_out), push suppressed (no_address)")
    ]
    # Starting at the first channel, or with nothing to start, needs no explanation.
    assert fallback._start_events(["sms", "push"], [(3, "sms", "queued", ""), (1, "push", "pending", "")]) == []
    assert (
        fallback._start_events(["push", "sms"], [(1, "push", "suppressed", "x"), (2, "sms", "suppressed", "y")]) == []
    )


# --- a decision on a chain that is under way ---------------------------------------------------------------------

Row = tuple[Any, ...]


@st.composite
def under_way(draw: st.DrawFn) -> tuple[list[Row], str, int]:
    """The rows of one (notification, recipient) chain as _CHAIN_SQL reads them, some steps started, the rest pending.

    The steps before the first pending one are in any status; the pending ones may carry a deadline (not_before).
    """
    channels = draw(st.lists(st.sampled_from(settings.CHANNELS), min_size=2, max_size=5, unique=True))
    until = draw(st.sampled_from(fallback.UNTIL))
    seconds = draw(st.integers(min_value=1, max_value=3600))
    started = draw(st.integers(min_value=0, max_value=len(channels) - 1))
    rows: list[Row] = []
    for step, channel in enumerate(channels):
        for _ in range(draw(st.integers(min_value=1, max_value=2))):
            if step < started:
                status, not_before = draw(st.sampled_from(ANY_STATUS)), None
            else:
                status, not_before = "pending", draw(maybe_time)
            reason = draw(st.sampled_from(["", "no_address", "fallback"]))
            rows.append(
                (len(rows) + 1, "n-1", 7, channel, status, reason, not_before, "normal", channels, until, seconds)
            )
    return rows, until, seconds


def _decide(rows: list[Row], now: datetime = NOW) -> tuple[Decisions, list[Any], list[int], list[int], list[Any]]:
    decisions = Decisions()
    events: list[tuple[int, str, str]] = []
    starts: list[int] = []
    skips: list[int] = []
    deadlines: list[tuple[int, datetime]] = []
    fallback._decide_chain(rows, now, decisions, events, starts, skips, deadlines)
    return decisions, events, starts, skips, deadlines


def _moved(rows: list[Row], starts: list[int], skips: list[int], deadlines: list[Any]) -> list[Row]:
    due = dict(deadlines)
    out = []
    for r in rows:
        status = "queued" if r[0] in starts else "skipped" if r[0] in skips else r[4]
        out.append((*r[:4], status, r[5], due.get(r[0], r[6]), *r[7:]))
    return out


@given(under_way())
def test_a_decision_starts_at_most_the_next_step_and_never_touches_what_went(chain: tuple[list[Row], str, int]) -> None:
    rows, until, seconds = chain
    channels = rows[0][8]
    decisions, events, starts, skips, deadlines = _decide(rows)
    by_id = {r[0]: r for r in rows}

    def step(delivery_id: int) -> int:
        return int(channels.index(by_id[delivery_id][3]))

    assert not set(starts) & set(skips)
    assert len(set(starts)) == len(starts) and len(set(skips)) == len(skips)
    # Only pending deliveries start, all of them on one step: the first pending one.
    pending = [r for r in rows if r[4] == "pending"]
    first_pending = min(channels.index(r[3]) for r in pending) if pending else None
    assert all(by_id[i][4] == "pending" and step(i) == first_pending for i in starts)
    if starts:
        assert set(starts) == {r[0] for r in pending if channels.index(r[3]) == first_pending}
    # Skipped: a pending step, or what of a step that timed out had not gone to a provider yet.
    assert all(by_id[i][4] == "pending" or by_id[i][4] in WAITING for i in skips)
    earlier = [r for r in rows if first_pending is not None and channels.index(r[3]) < first_pending]
    if any(r[4] in REACHED[until] for r in earlier):
        # A step reached fallback_until: nothing more starts, everything pending ends skipped.
        assert not starts and set(skips) == {r[0] for r in pending}
    elif starts and not (earlier and all(r[4] in GAVE_UP for r in earlier)):
        # Started without the step before giving up: only because its deadline passed.
        assert any(by_id[i][6] is not None and by_id[i][6] <= NOW + timedelta(seconds=1) for i in starts)
    # The step after the started one gets the window as its deadline, the ones after it none yet.
    if deadlines:
        assert starts
        following = {step(i) for i, _ in deadlines}
        assert first_pending is not None and len(following) == 1 and following.pop() > first_pending
        assert {at for _, at in deadlines} == {NOW + timedelta(seconds=seconds)}
    # Every move is an event, and what started is published once.
    assert sorted(events) == sorted(
        [(i, "queued", events_of(events, i)) for i in starts] + [(i, "skipped", events_of(events, i)) for i in skips]
    )
    assert sorted(p[0] for p in decisions.publish) == sorted(starts) == sorted(decisions.started)
    assert all(p == (i, by_id[i][3], by_id[i][7]) for p in decisions.publish for i in [p[0]])


def events_of(events: list[tuple[int, str, str]], delivery_id: int) -> str:
    """Return the detail of the one event of a delivery."""
    (detail,) = [e[2] for e in events if e[0] == delivery_id]
    return detail


@given(under_way().filter(lambda chain: chain[2] > 1))
def test_deciding_again_at_the_same_moment_moves_nothing(chain: tuple[list[Row], str, int]) -> None:
    # (A window of one second is within the timer's tolerance of a second: its next step is due at once.)
    rows, _, _ = chain
    _, _, starts, skips, deadlines = _decide(rows)
    _, events, starts_again, skips_again, deadlines_again = _decide(_moved(rows, starts, skips, deadlines))
    assert (events, starts_again, skips_again, deadlines_again) == ([], [], [], [])
