"""The decision records stay readable: each is at most a page, and the index lists each one once, with a status."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

DECISIONS = Path(__file__).resolve().parents[2] / "docs" / "decisions"
RECORDS = sorted(p for p in DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md"))
# A page of prose: about fifty lines of a dozen words, a little more for a record's headings and code names.
PAGE_WORDS = 650
INDEX_ROW = re.compile(r"^\| (\d{4}) \| \[[^\]]+\]\((\d{4}-[^)]+\.md)\) \| ([^|]+) \|$")


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: p.name[:4])
def test_a_decision_is_at_most_a_page(record: Path) -> None:
    words = len(record.read_text().split())
    assert words <= PAGE_WORDS, f"{record.name}: {words} words; keep the decision, move the history to git"


def test_the_index_lists_every_decision_once_under_a_topic_with_its_status() -> None:
    rows = [INDEX_ROW.match(line) for line in (DECISIONS / "README.md").read_text().splitlines()]
    listed = [(m.group(1), m.group(2), m.group(3).strip()) for m in rows if m]
    files = [name for _, name, _ in listed]
    assert sorted(files) == [p.name for p in RECORDS], "every record listed exactly once"
    assert all(name.startswith(number) for number, name, _ in listed)
    assert all(status for _, _, status in listed)
