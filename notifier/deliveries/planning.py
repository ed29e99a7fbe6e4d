"""Delivery planning: where a new delivery goes and the status it starts in, for every path that creates one.

Accept (notifier/accepting/services.py: single, batch, support re-sends) and fan-out (notifier/dispatch/fanout.py,
which works on
plain rows instead of model instances) call the same two functions, so a rule changed here holds everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from core.chat import is_chat
from notifier.deliveries.models import Delivery
from preferences.compliance import evaluate
from preferences.models import Device, Recipient

S = Delivery.Status


class Addressable(Protocol):
    """The recipient fields addresses come from: a Recipient, or fan-out's row of one."""

    pk: int
    email: str
    phone: str
    user_id: str
    webhook_url: str
    chat: dict[str, str]


@dataclass(frozen=True)
class Plan:
    """A new delivery's first status, its reason (empty when it is sent) and when it may go (None: now)."""

    status: str
    reason: str
    not_before: datetime | None


def channel_addresses(
    recipient: Addressable, channel: str, *, webhook_default: str, tokens: Sequence[str] | None = None
) -> list[str]:
    """Return the addresses of `recipient` on `channel` ([""] when there is none, reported as no_address).

    `webhook_default` is the calling client's webhook URL, used when the recipient has none of their own.
    `tokens` are the recipient's active device tokens when the caller has loaded them (batch and fan-out);
    without them push tokens are read here.
    """
    if channel == "email":
        return [recipient.email]
    if channel == "sms":
        return [recipient.phone]
    if channel == "inapp":
        return [recipient.user_id]
    if channel == "webhook":
        return [recipient.webhook_url or webhook_default]
    if is_chat(channel):
        return [(recipient.chat or {}).get(channel, "")]
    if channel == "push":
        if tokens is None:
            tokens = list(Device.objects.filter(recipient_id=recipient.pk, active=True).values_list("token", flat=True))
        return list(tokens) or [""]
    raise ValueError(f"unknown channel {channel}")


def delivery_plan(
    *,
    recipient: Recipient,
    category: str,
    channel: str,
    address: str,
    send_at: datetime | None,
    now: datetime,
    suppressed: bool | None = None,
) -> Plan:
    """Decide a new delivery's first status from compliance (evaluate) and the send time.

    `suppressed` is the caller's suppression-list answer when it looked many up at once (None: look it up).
    """
    verdict = evaluate(
        recipient=recipient, category=category, channel=channel, address=address, now=now, suppressed=suppressed
    )
    if verdict.action == "suppress":
        return Plan(S.SUPPRESSED, verdict.reason, None)
    if verdict.action == "digest":
        return Plan(S.DEFERRED, verdict.reason or "digest", None)
    if verdict.action == "defer":
        until = verdict.until
        return Plan(S.DEFERRED, verdict.reason or "quiet_hours", max(until, send_at) if send_at and until else until)
    if send_at and send_at > now:
        return Plan(S.SCHEDULED, "", send_at)
    return Plan(S.QUEUED, "", None)
