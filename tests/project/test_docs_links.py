"""Every relative link in the README and docs/ leads somewhere: the file exists, and an #anchor names a heading.

Anchors follow GitHub's rule (lowercase; punctuation other than `-` and `_` dropped; spaces become `-`; a
repeated heading gets `-1`, `-2`, ...), so a link that works here works on the rendered page.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parents[2]
TOP_PAGES = ["README.md", "CHANGELOG.md", "SECURITY.md", "clients/python/README.md"]
PAGES = sorted([*(ROOT / name for name in TOP_PAGES), *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`]*`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """Return (line number, line) of the lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """Return GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading counts by its text
    text = text.lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Return every anchor of a Markdown file's headings."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in _prose_lines(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(path: Path) -> list[tuple[int, str]]:
    """Return (line number, target) of every relative link in a Markdown file's prose."""
    numbered = dict(_prose_lines(path.read_text()))
    # Code blocks become empty lines, so a match's offset still tells its line; a link's text may wrap.
    prose = "\n".join(INLINE_CODE.sub("", numbered.get(n, "")) for n in range(1, max(numbered, default=0) + 1))
    found = []
    for match in LINK.finditer(prose):
        target = match.group(1)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked
            found.append((prose.count("\n", 0, match.start()) + 1, target))
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Return a line per link of `path` whose file or anchor does not exist, named relative to `root`."""
    broken = []
    for number, target in links(path):
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not destination.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{where} (no heading with that anchor)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    """Each relative link of the page names an existing file and, with an #anchor, one of its headings."""
    assert not broken_links(page), "\n".join(broken_links(page))


def test_the_checker_finds_a_broken_file_and_a_broken_anchor(tmp_path: Path) -> None:
    """A link to a missing file and one to a missing heading are both reported; good ones are not."""
    (tmp_path / "other.md").write_text("# Other page\n\n## Idempotency: `dedup_key`\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#idempotency-dedup_key) [ok](other.md#twice-1) [ok](#page)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere)\n\n```\n[in code](ignored.md)\n```\n"
        "`[inline](ignored.md)` [web](https://example.com/x) [a link that\nwraps](wrapped.md)\n"
    )
    assert broken_links(page, root=tmp_path) == [
        "page.md:4: missing.md (no such file)",
        "page.md:4: other.md#nowhere (no heading with that anchor)",
        "page.md:9: wrapped.md (no such file)",
    ]
