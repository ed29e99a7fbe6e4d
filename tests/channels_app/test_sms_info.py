"""Segment counting for GSM-7 (with the extension table) and UCS-2 (with characters outside the BMP)."""

from __future__ import annotations

import pytest

from templates_app.sms import GSM7, UCS2, sms_info

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("text", "encoding", "units", "segments"),
    [
        ("", GSM7, 0, 0),
        ("a" * 160, GSM7, 160, 1),
        ("a" * 161, GSM7, 161, 2),
        ("a" * 306, GSM7, 306, 2),
        ("a" * 307, GSM7, 307, 3),
        ("€" * 80, GSM7, 160, 1),  # extension characters count two
        ("€" * 81, GSM7, 162, 2),
        ("a" * 152 + "€" + "a" * 152, GSM7, 306, 3),  # 306 units fit two parts, but the escape pair is not split
        ("Привет", UCS2, 6, 1),
        ("я" * 70, UCS2, 70, 1),
        ("я" * 71, UCS2, 71, 2),
        ("😀" * 35, UCS2, 70, 1),  # outside the BMP: two code units each
        ("😀" * 36, UCS2, 72, 2),
        ("a" * 66 + "😀", UCS2, 68, 1),
        ("a" * 69 + "😀", UCS2, 71, 2),
    ],
)
def test_sms_info(text: str, encoding: str, units: int, segments: int) -> None:
    info = sms_info(text)
    assert (info.encoding, info.units, info.segments) == (encoding, units, segments)


def test_split_never_cuts_a_surrogate_pair() -> None:
    # 66 units then an emoji (2): 68 > 70? no, fits one segment only if ≤ 70 in total.
    assert sms_info("a" * 68 + "😀").segments == 1
    assert sms_info("a" * 69 + "😀").segments == 2
    # Multi-part: 67 per part; 66 + emoji would straddle, so it moves whole to the next part.
    assert sms_info("a" * 66 + "😀" + "a" * 66).segments == 3
