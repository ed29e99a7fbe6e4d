"""SMS that fits: record each SMS delivery's encoding and segment count, and refuse what is too long.

Called by the pipeline right after rendering (channels_app/services.py), before any provider is picked, so a
message longer than SMS_MAX_SEGMENTS costs nothing: it fails with reason `too_long` and no provider is paid.
The counting itself is templates_app.sms.sms_info (GSM-7 with the extension table, UCS-2 with surrogates).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from channels_app.providers.base import ProviderError
from core import metrics
from templates_app.sms import sms_info

TOO_LONG = "too_long"


def sms_fit(channel: str, parts: dict[str, Any]) -> tuple[dict[str, Any], ProviderError | None]:
    """Return the SMS fields to store on the delivery and, for a text over the limit, the error to fail it with.

    Other channels get ({}, None).
    """
    if channel != "sms":
        return {}, None
    info = sms_info(str(parts.get("text") or ""))
    fields = {"sms_encoding": info.encoding, "sms_segments": info.segments}
    limit = settings.SMS_MAX_SEGMENTS
    if limit and info.segments > limit:
        message = f"{info.segments} segments ({info.encoding}, {info.units} units) exceed SMS_MAX_SEGMENTS={limit}"
        return fields, ProviderError(message, retriable=False, code=TOO_LONG)
    return fields, None


def count_sent(updates: list[tuple[Any, dict[str, Any]]]) -> None:
    """Count the segments of the SMS deliveries a batch sent, by encoding (what the providers bill)."""
    totals: dict[str, int] = {}
    for delivery, fields in updates:
        if fields.get("status") == "sent" and delivery.channel == "sms" and delivery.sms_segments:
            totals[delivery.sms_encoding] = totals.get(delivery.sms_encoding, 0) + delivery.sms_segments
    for encoding, n in totals.items():
        metrics.count_sms_segments(encoding, n)
