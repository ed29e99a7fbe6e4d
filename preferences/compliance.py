"""Compliance verdicts: may this message go to this recipient on this channel now, later, in a digest, or never.

Called at accept (notifier.accepting.services) and again right before every send (channels_app.services), so a
preference or suppression that changed while a delivery waited is honoured. Pure apart from the optional
suppression-list lookup, which bulk callers answer themselves with `suppressed_addresses()`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.utils import timezone

from core.categories import category_config
from core.db import bound_cursor, json_rows
from preferences.models import Recipient, Suppression
from projects.scoping import owner_default

SEND = "send"
SUPPRESS = "suppress"
DEFER = "defer"
DIGEST = "digest"

DIGEST_FREQUENCIES = ("hourly_digest", "daily_digest")
FREQUENCIES = ("immediate", *DIGEST_FREQUENCIES)


@dataclass(frozen=True)
class Verdict:
    """What to do with one delivery: `action` is "send", "suppress", "defer" or "digest".

    `reason` explains a non-send ("suppressed", "erased", "no_address", "opted_out", "channel_disabled",
    "category_disabled", "quiet_hours", "digest:<frequency>"); `until` is the aware UTC instant a deferral
    ends.
    """

    action: str
    reason: str = ""
    until: dt.datetime | None = None


def recipient_zone(recipient: Recipient) -> ZoneInfo:
    """Return the recipient's IANA zone, UTC when unset or unknown."""
    if recipient.timezone:
        try:
            return ZoneInfo(recipient.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    return ZoneInfo("UTC")


def quiet_hours_end(
    *, start: dt.time | None, end: dt.time | None, zone: ZoneInfo, now: dt.datetime
) -> dt.datetime | None:
    """Return the aware UTC end of the quiet window `now` falls in, or None when `now` is outside it.

    The window is [start, end) in local wall-clock time and wraps midnight when start > end. The end is
    built from the local calendar date, not by adding hours, so it is right on the nights clocks change.
    """
    if start is None or end is None or start == end:
        return None
    local = now.astimezone(zone)
    t = local.time().replace(tzinfo=None)
    if start < end:
        if not (start <= t < end):
            return None
        end_date = local.date()
    else:
        if t >= start:
            end_date = local.date() + dt.timedelta(days=1)
        elif t < end:
            end_date = local.date()
        else:
            return None
    # fold=0: an end inside a spring-forward gap resolves with the pre-transition offset, i.e. at or after
    # the moment the wall clock passes it (never early); an ambiguous autumn end resolves to its first
    # occurrence, the first moment the wall clock shows it.
    local_end = dt.datetime.combine(end_date, end, tzinfo=zone)
    until = local_end.astimezone(dt.UTC)
    if until <= now:
        # `now` is in the repeated hour of an autumn night, past the end's first occurrence: the window ends at
        # its second one. (A deferral that ended in the past would be taken and deferred again at once.)
        until = local_end.replace(fold=1).astimezone(dt.UTC)
    return until


def evaluate(
    *,
    recipient: Recipient,
    category: str,
    channel: str,
    address: str,
    now: dt.datetime | None = None,
    suppressed: bool | None = None,
    digestible: bool = True,
) -> Verdict:
    """Decide whether a delivery to `address` on `channel` for `category` is sent, suppressed, deferred or digested.

    `suppressed` is the caller's already-known suppression-list answer (bulk callers look many up at once).
    `digestible=False` is for a delivery that is itself a digest, so it is never folded into another one.
    """
    if address:
        if suppressed is None:
            suppressed = Suppression.objects.filter(channel=channel, address=address).exists()
        if suppressed:
            return Verdict(SUPPRESS, "suppressed")
    if recipient.erased_at is not None:
        return Verdict(SUPPRESS, "erased")
    if not address:
        return Verdict(SUPPRESS, "no_address")

    config = category_config(category)
    # Security and transactional messages go through whatever the recipient prefers, at any hour.
    if not config.get("optional", True):
        return Verdict(SEND)

    if recipient.opted_out:
        return Verdict(SUPPRESS, "opted_out")
    if (recipient.channel_prefs or {}).get(channel) is False:
        return Verdict(SUPPRESS, "channel_disabled")
    prefs = (recipient.category_prefs or {}).get(category) or {}
    if prefs.get("enabled") is False:
        return Verdict(SUPPRESS, "category_disabled")
    channels = prefs.get("channels")
    if channels is not None and channel not in channels:
        return Verdict(SUPPRESS, "category_disabled")
    frequency = prefs.get("frequency") or "immediate"
    if digestible and frequency in DIGEST_FREQUENCIES:
        return Verdict(DIGEST, f"digest:{frequency}")

    if config.get("quiet_hours", True):
        until = quiet_hours_end(
            start=recipient.quiet_start,
            end=recipient.quiet_end,
            zone=recipient_zone(recipient),
            now=now or timezone.now(),
        )
        if until is not None:
            return Verdict(DEFER, "quiet_hours", until)
    return Verdict(SEND)


def suppressed_addresses(pairs: list[tuple[str, str]], *, environment_id: int | None = None) -> set[tuple[str, str]]:
    """Return which of the (channel, address) pairs are on an environment's suppression list, in one query.

    The environment's own entries and the installation-wide ones (environment_id NULL: provider bounces and
    complaints); of `environment_id`, else of the scope's owner (projects.scoping). The pairs travel as one JSON
    parameter (core.db.json_rows): one query and one plan for a page of 5,000.
    """
    wanted = {(channel, address) for channel, address in pairs if address}
    if not wanted:
        return set()
    with bound_cursor() as cursor:
        cursor.execute(
            "SELECT s.channel, s.address FROM preferences_suppression s "
            "JOIN jsonb_array_elements(%s::jsonb) AS e ON s.channel = e->>0 AND s.address = e->>1 "
            "WHERE s.environment_id = %s OR s.environment_id IS NULL",
            [json_rows(wanted), environment_id or owner_default()],
        )
        return {(channel, address) for channel, address in cursor.fetchall()}
