"""Write tests/slowest.txt from a pytest run's `--durations` report: its longest tests, longest first.

`make test` starts the parallel phase with these tests (tests/conftest.py, `pytest_collection_modifyitems`), so a
long test never begins near the end while the other workers have run out of work. The list only orders tests:
one missing from it, or renamed, still runs, in its place after the listed ones.

    .venv/bin/pytest -n 3 --dist loadgroup -m "not serial" --durations=120 | tee var/durations.log
    .venv/bin/python scripts/slowest_tests.py var/durations.log
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# "12.34s call     tests/x/test_y.py::test_z[param]"
LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S.*)$")
KEEP = 80


def main(log: Path) -> None:
    """Sum each test's setup, call and teardown in `log` and write the longest KEEP to tests/slowest.txt."""
    seconds: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        found = LINE.match(line)
        if found and "tests/cluster/" not in found[2]:
            nodeid = found[2].strip()
            seconds[nodeid] = seconds.get(nodeid, 0.0) + float(found[1])
    if not seconds:
        sys.exit(f"no --durations lines in {log}")
    lines = [f"{nodeid}  # {total:.0f} s" for nodeid, total in sorted(seconds.items(), key=lambda kv: -kv[1])[:KEEP]]
    header = "# The longest tests of the parallel phase, longest first: scripts/slowest_tests.py wrote this.\n"
    (ROOT / "tests" / "slowest.txt").write_text(header + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
