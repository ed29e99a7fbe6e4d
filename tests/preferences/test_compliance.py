"""Compliance verdicts: suppression list, erasure, opt-outs, category rules, digests and quiet hours."""

from __future__ import annotations

import datetime as dt

import pytest
from pytest_django import DjangoAssertNumQueries

from preferences.compliance import Verdict, evaluate, quiet_hours_end, suppressed_addresses
from preferences.models import Device, Recipient, Suppression
from preferences.services import recipient_upsert, suppression_add
from tests.factories import make_device, make_suppression

UTC = dt.UTC
NOON = dt.datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def _recipient(**fields: object) -> Recipient:
    """Return an unsaved recipient: evaluate() needs no row unless it looks at the suppression list."""
    return Recipient(user_id="u-1", email="a@example.com", **fields)


def _eval(recipient: Recipient, category: str = "marketing", channel: str = "email", **kw: object) -> Verdict:
    kw.setdefault("address", "a@example.com")
    kw.setdefault("suppressed", False)
    kw.setdefault("now", NOON)
    return evaluate(recipient=recipient, category=category, channel=channel, **kw)  # type: ignore[arg-type]  # test overrides


@pytest.mark.pure
def test_plain_recipient_is_sent() -> None:
    assert _eval(_recipient()) == Verdict("send")


@pytest.mark.django_db
def test_suppression_list_applies_to_every_category() -> None:
    suppression_add(channel="email", address="a@example.com", source="bounce", reason="hard bounce")
    for category in ("security", "transactional", "marketing", "unknown"):
        verdict = evaluate(recipient=_recipient(), category=category, channel="email", address="a@example.com")
        assert verdict == Verdict("suppress", "suppressed"), category
    # Another channel or address is unaffected.
    assert evaluate(recipient=_recipient(), category="marketing", channel="sms", address="a@example.com").action == (
        "send"
    )
    assert evaluate(recipient=_recipient(), category="marketing", channel="email", address="b@example.com").action == (
        "send"
    )


@pytest.mark.pure
def test_caller_known_suppression_wins_without_query() -> None:
    # No django_db mark: a query here would raise.
    assert _eval(_recipient(), category="security", suppressed=True) == Verdict("suppress", "suppressed")


@pytest.mark.pure
def test_erased_and_no_address() -> None:
    assert _eval(_recipient(erased_at=NOON), category="security") == Verdict("suppress", "erased")
    assert _eval(_recipient(), category="security", address="") == Verdict("suppress", "no_address")


@pytest.mark.pure
def test_opt_out_and_channel_switch_only_affect_optional_categories() -> None:
    opted = _recipient(opted_out=True)
    assert _eval(opted) == Verdict("suppress", "opted_out")
    assert _eval(opted, category="unknown-category") == Verdict("suppress", "opted_out")
    assert _eval(opted, category="security").action == "send"
    assert _eval(opted, category="transactional").action == "send"
    no_sms = _recipient(channel_prefs={"sms": False})
    assert _eval(no_sms, channel="sms", address="+4915112345678") == Verdict("suppress", "channel_disabled")
    assert _eval(no_sms, channel="email").action == "send"
    assert _eval(no_sms, category="security", channel="sms", address="+4915112345678").action == "send"


@pytest.mark.pure
def test_category_disabled_or_channel_not_listed() -> None:
    off = _recipient(category_prefs={"marketing": {"enabled": False}})
    assert _eval(off) == Verdict("suppress", "category_disabled")
    assert _eval(off, category="social").action == "send"
    email_only = _recipient(category_prefs={"marketing": {"enabled": True, "channels": ["email"]}})
    assert _eval(email_only).action == "send"
    assert _eval(email_only, channel="push", address="tok") == Verdict("suppress", "category_disabled")
    # Preferences stored for a non-optional category never suppress it.
    forced = _recipient(category_prefs={"security": {"enabled": False, "channels": []}})
    assert _eval(forced, category="security").action == "send"


@pytest.mark.pure
def test_digest_frequencies() -> None:
    daily = _recipient(category_prefs={"marketing": {"frequency": "daily_digest"}})
    assert _eval(daily) == Verdict("digest", "digest:daily_digest")
    hourly = _recipient(category_prefs={"social": {"frequency": "hourly_digest"}})
    assert _eval(hourly, category="social") == Verdict("digest", "digest:hourly_digest")
    assert _eval(_recipient(category_prefs={"marketing": {"frequency": "immediate"}})).action == "send"
    # A digest delivery itself is never folded again; it still honours quiet hours.
    assert _eval(daily, digestible=False).action == "send"


def _quiet(start: str, end: str, tz: str = "") -> Recipient:
    return _recipient(quiet_start=dt.time.fromisoformat(start), quiet_end=dt.time.fromisoformat(end), timezone=tz)


@pytest.mark.pure
def test_quiet_hours_defer_until_window_end_in_utc_without_timezone() -> None:
    r = _quiet("09:00", "17:00")
    assert _eval(r, now=NOON) == Verdict("defer", "quiet_hours", dt.datetime(2025, 6, 1, 17, 0, tzinfo=UTC))
    assert _eval(r, now=NOON.replace(hour=17)).action == "send"  # end is exclusive
    assert _eval(r, now=NOON.replace(hour=9)).action == "defer"  # start is inclusive
    assert _eval(r, now=NOON.replace(hour=8, minute=59)).action == "send"


@pytest.mark.pure
def test_quiet_window_wrapping_midnight() -> None:
    r = _quiet("22:00", "08:00", "Europe/Berlin")  # June: CEST, UTC+2
    late = dt.datetime(2025, 6, 1, 21, 30, tzinfo=UTC)  # 23:30 local
    assert _eval(r, now=late) == Verdict("defer", "quiet_hours", dt.datetime(2025, 6, 2, 6, 0, tzinfo=UTC))
    early = dt.datetime(2025, 6, 2, 3, 0, tzinfo=UTC)  # 05:00 local, same window
    assert _eval(r, now=early) == Verdict("defer", "quiet_hours", dt.datetime(2025, 6, 2, 6, 0, tzinfo=UTC))
    assert _eval(r, now=dt.datetime(2025, 6, 2, 6, 0, tzinfo=UTC)).action == "send"  # 08:00 local
    assert _eval(r, now=dt.datetime(2025, 6, 1, 19, 59, tzinfo=UTC)).action == "send"  # 21:59 local


@pytest.mark.pure
def test_quiet_hours_across_october_dst_change_in_berlin() -> None:
    # Clocks go back 03:00 CEST -> 02:00 CET on Sunday 26 October 2025: the night is 25 hours long.
    r = _quiet("22:00", "08:00", "Europe/Berlin")
    saturday_night = dt.datetime(2025, 10, 25, 21, 0, tzinfo=UTC)  # 23:00 CEST
    verdict = _eval(r, now=saturday_night)
    assert verdict.action == "defer"
    assert verdict.until == dt.datetime(2025, 10, 26, 7, 0, tzinfo=UTC)  # 08:00 CET, not 06:00 UTC
    assert verdict.until.tzinfo is not None and verdict.until.utcoffset() == dt.timedelta(0)
    # Inside the repeated hour (second 02:30, CET) the end is the same.
    assert _eval(r, now=dt.datetime(2025, 10, 26, 1, 30, tzinfo=UTC)).until == verdict.until


@pytest.mark.pure
def test_quiet_hours_across_march_dst_change_in_berlin() -> None:
    # Clocks go forward 02:00 CET -> 03:00 CEST on Sunday 30 March 2025: the night is 23 hours long.
    r = _quiet("22:00", "08:00", "Europe/Berlin")
    saturday_night = dt.datetime(2025, 3, 29, 22, 0, tzinfo=UTC)  # 23:00 CET
    assert _eval(r, now=saturday_night).until == dt.datetime(2025, 3, 30, 6, 0, tzinfo=UTC)  # 08:00 CEST
    assert _eval(r, now=dt.datetime(2025, 3, 30, 6, 0, tzinfo=UTC)).action == "send"
    assert _eval(r, now=dt.datetime(2025, 3, 30, 5, 59, tzinfo=UTC)).action == "defer"


@pytest.mark.pure
def test_quiet_end_inside_spring_forward_gap_is_never_early() -> None:
    zone_end = quiet_hours_end(
        start=dt.time(1, 0),
        end=dt.time(2, 30),  # does not exist in Berlin on 30 March 2025
        zone=__import__("zoneinfo").ZoneInfo("Europe/Berlin"),
        now=dt.datetime(2025, 3, 30, 0, 30, tzinfo=UTC),  # 01:30 CET
    )
    assert zone_end is not None
    # The wall clock jumps past 02:30 at 01:00 UTC; the deferral must not end before that.
    assert zone_end >= dt.datetime(2025, 3, 30, 1, 0, tzinfo=UTC)


@pytest.mark.pure
def test_non_optional_categories_are_never_held_by_quiet_hours() -> None:
    r = _quiet("00:00", "23:59", "Europe/Berlin")
    assert _eval(r, category="transactional").action == "send"
    assert _eval(r, category="security").action == "send"
    assert _eval(r, category="marketing").action == "defer"
    assert _eval(r, category="never-configured").action == "defer"


@pytest.mark.pure
def test_invalid_or_missing_timezone_falls_back_to_utc() -> None:
    r = _quiet("11:00", "13:00", "Not/AZone")
    assert _eval(r, now=NOON).until == dt.datetime(2025, 6, 1, 13, 0, tzinfo=UTC)


@pytest.mark.django_db
def test_suppressed_addresses_in_one_query(django_assert_num_queries: DjangoAssertNumQueries) -> None:
    for i in range(5):
        make_suppression(channel="email", address=f"x{i}@example.com")
    make_suppression(channel="sms", address="+15550000001")
    pairs = [("email", f"x{i}@example.com") for i in range(10)] + [
        ("sms", "+15550000001"),
        ("sms", "x0@example.com"),
        ("push", "tok"),
        ("email", ""),
    ]
    with django_assert_num_queries(1):
        found = suppressed_addresses(pairs)
    assert found == {("email", f"x{i}@example.com") for i in range(5)} | {("sms", "+15550000001")}
    with django_assert_num_queries(0):
        assert suppressed_addresses([]) == set()


@pytest.mark.django_db
def test_suppression_add_is_idempotent_and_deactivates_push_token() -> None:
    r, _ = recipient_upsert(user_id="u-push")
    make_device(recipient=r, token="tok-1")
    make_device(recipient=r, token="tok-2")
    first = suppression_add(channel="push", address="tok-1", source="invalid", reason="unregistered")
    again = suppression_add(channel="push", address="tok-1", source="manual")
    assert first.pk == again.pk and again.source == "invalid"
    assert Suppression.objects.filter(channel="push", address="tok-1").count() == 1
    assert list(Device.objects.filter(active=True).values_list("token", flat=True)) == ["tok-2"]
    assert Device.objects.get(token="tok-1").deactivated_at is not None


@pytest.mark.django_db
def test_recipient_upsert_creates_updates_and_revives_erased() -> None:
    r, created = recipient_upsert(user_id="u-up", email="a@example.com", locale="de")
    assert created and r.email == "a@example.com"
    r2, created = recipient_upsert(user_id="u-up", phone="+4915112345678")
    assert not created and r2.pk == r.pk
    r2.refresh_from_db()
    assert (r2.email, r2.phone, r2.locale) == ("a@example.com", "+4915112345678", "de")
    Recipient.objects.filter(pk=r.pk).update(erased_at=NOON)
    r3, created = recipient_upsert(user_id="u-up", email="b@example.com")
    r3.refresh_from_db()
    assert not created and r3.erased_at is None and r3.email == "b@example.com"
    with pytest.raises(TypeError):
        recipient_upsert(user_id="u-up", user_ide="x")
