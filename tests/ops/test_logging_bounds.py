"""Log masking reads a bounded amount of each field, finds what it must in what it reads, and masks tracebacks."""

from __future__ import annotations

import io
import json
import logging

import pytest

from core.logs import MAX_FIELD_CHARS, json_formatter, mask_text, mask_value

pytestmark = pytest.mark.pure


def test_a_huge_field_is_cut_to_head_and_tail_and_still_masked() -> None:
    text = "start bob@example.com " + "a" * 200_000 + " end +4915112345678"
    masked = mask_text(text)
    assert len(masked) < MAX_FIELD_CHARS + 100
    assert masked.startswith("start [email] ")
    assert masked.endswith(" end [phone]")
    assert "characters cut" in masked and "bob@" not in masked


def test_long_runs_without_an_at_sign_keep_their_text_and_emails_after_them_are_found() -> None:
    # The runs the old pattern rescanned from every position (quadratic); each kind must come out intact.
    for run in ("a" * 5000, "a_" * 2500, "a." * 2500, "-" * 5000):
        assert mask_text(run + " jo@example.org") == run + " [email]"
    assert mask_text("a/b@x.com, foo+bar@ex.co.uk") == "[email], [email]"


def test_nested_values_are_bounded_too() -> None:
    value = mask_value({"detail": ["z" * (3 * MAX_FIELD_CHARS)]})
    assert len(value["detail"][0]) < MAX_FIELD_CHARS + 100


def test_tracebacks_are_masked_and_keep_where_they_failed() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter())
    logger = logging.getLogger("tests.traceback")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ValueError("cannot reach ann@example.com at +14155550123" + " filler" * 5000)
        except ValueError:
            logger.exception("send failed")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    line = json.loads(stream.getvalue())
    assert "ann@example.com" not in stream.getvalue() and "+14155550123" not in stream.getvalue()
    assert "[email]" in line["exception"] and "[phone]" in line["exception"]
    assert "Traceback" in line["exception"] and line["exception"].rstrip().endswith("filler")
    assert "ValueError" in line["exception"]
