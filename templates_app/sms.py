"""How an SMS text travels: its encoding (GSM-7 or UCS-2) and how many segments it costs.

GSM 03.38: the basic table costs one septet per character, the extension table (``^{}\\[~]|€`` and form feed)
two (an escape plus the character). One segment carries 160 septets, or 153 each when the message is split
(the user data header takes 7). Anything outside both tables forces UCS-2: 70 code units in one segment,
67 each when split, and a character outside the Basic Multilingual Plane takes two code units (a surrogate
pair). A split never cuts an escape sequence or a surrogate pair, so segments are counted by packing whole
characters, not by dividing the length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

GSM7_BASIC = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞ\x1bÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?"
    "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
GSM7_EXTENSION = frozenset("\f^{}\\[~]|€")

GSM7 = "gsm7"
UCS2 = "ucs2"


@dataclass(frozen=True)
class SmsInfo:
    """The encoding of a text, its length in that encoding's units, and the segments it is sent in."""

    encoding: str
    units: int
    segments: int


def _cost_gsm7(char: str) -> int:
    return 2 if char in GSM7_EXTENSION else 1


def _cost_ucs2(char: str) -> int:
    return 2 if ord(char) > 0xFFFF else 1


def _segments(costs: list[int], single: int, multi: int) -> int:
    total = sum(costs)
    if total <= single:
        return 1 if total else 0
    segments, used = 1, 0
    for cost in costs:
        if used + cost > multi:  # never split an escape sequence or a surrogate pair
            segments, used = segments + 1, 0
        used += cost
    return segments


def sms_info(text: str) -> SmsInfo:
    """Return the encoding, length in units and segment count of `text` (an empty text is 0 segments)."""
    if all(c in GSM7_BASIC or c in GSM7_EXTENSION for c in text):
        costs = [_cost_gsm7(c) for c in text]
        return SmsInfo(GSM7, sum(costs), _segments(costs, 160, 153))
    costs = [_cost_ucs2(c) for c in text]
    return SmsInfo(UCS2, sum(costs), _segments(costs, 70, 67))


def sms_preview(text: str) -> dict[str, Any]:
    """Describe an SMS text for a preview: encoding, units, segments, the limit, and a warning when it matters."""
    info = sms_info(text)
    limit = settings.SMS_MAX_SEGMENTS
    warning = ""
    if limit and info.segments > limit:
        warning = f"{info.segments} segments: over the limit of {limit}, this message would fail (too_long)."
    elif info.segments > 1:
        warning = f"{info.segments} segments ({info.encoding}): each is billed as one message."
    elif info.encoding == UCS2:
        warning = "UCS-2: a character outside GSM-7 leaves 70 characters per segment instead of 160."
    return {
        "encoding": info.encoding,
        "units": info.units,
        "segments": info.segments,
        "max_segments": limit,
        "warning": warning,
    }
