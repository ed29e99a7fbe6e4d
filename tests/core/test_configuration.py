"""The one settings reader (core/env.py) and its table (docs/configuration.md).

Bad values stop `manage.py` with one line naming the variable (no traceback); every variable the code reads
is in the table with its type, and every row of the table is a variable something reads, so the two cannot drift.
"""

from __future__ import annotations

import ast
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from core.env import READS

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "configuration.md"
# The reader's getters and the type each one stands for in the table.
GETTERS = {"str": "str", "bool": "bool", "int": "int", "float": "float", "list": "list", "json": "json"}
GETTERS["int_or_off"] = "int or off"
SKIP_DIRS = {".venv", "tests", "bench", "clients", "var", ".git", "node_modules"}


def _source_files() -> list[Path]:
    """Return the project's own Python files (not tests, benchmarks or the installed packages)."""
    return [p for p in ROOT.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(ROOT).parts)]


def _static_reads() -> dict[str, str]:
    """Return {variable: type} for every `env.<getter>("NAME")` call in the source, constants resolved."""
    found: dict[str, str] = {}
    for path in _source_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        constants = {
            t.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for t in node.targets
            if isinstance(t, ast.Name) and isinstance(node.value.value, str)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                continue
            owner = node.func.value
            if not (isinstance(owner, ast.Name) and owner.id in {"env", "_env"} and node.func.attr in GETTERS):
                continue
            arg = node.args[0]
            name = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", ""))
            if isinstance(name, str):
                found[name] = GETTERS[node.func.attr]
    return found


def _read_variables() -> dict[str, str]:
    """Return {variable: type} of everything read: at import (settings, Celery, gunicorn) and in the source."""
    import config.celery
    import config.settings  # noqa: F401

    runpy.run_path(str(ROOT / "gunicorn.conf.py"))
    reads = {read.name: read.type for read in READS.values()}
    for name, type_ in _static_reads().items():
        assert reads.setdefault(name, type_) == type_, f"{name} is read as {reads[name]} and as {type_}"
    return reads


def _table() -> dict[str, str]:
    """Return {variable: type} of the rows of docs/configuration.md's table."""
    rows: dict[str, str] = {}
    for line in TABLE.read_text().splitlines():
        match = re.match(r"\|\s*`([A-Z][A-Z0-9_]*)`\s*\|\s*([^|]+?)\s*\|", line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} has two rows"
            rows[match.group(1)] = match.group(2).strip("` ")
    return rows


def test_every_variable_read_is_in_the_table_with_its_type() -> None:
    """A variable added to the code without a row (or with another type) fails here."""
    reads, table = _read_variables(), _table()
    missing = sorted(set(reads) - set(table))
    assert not missing, f"docs/configuration.md lacks rows for {missing}"
    wrong = {name: (reads[name], table[name]) for name in reads if table[name] != reads[name]}
    assert not wrong, f"types differ (code, table): {wrong}"


def test_every_row_is_a_variable_something_reads() -> None:
    """A row whose variable nothing reads any more fails here; the Procfile's own variables are read by its shell."""
    reads, table = _read_variables(), _table()
    procfile = (ROOT / "Procfile").read_text()
    stale = sorted(name for name in set(table) - set(reads) if "${" + name + ":-" not in procfile)
    assert not stale, f"docs/configuration.md has rows nothing reads: {stale}"


def test_nothing_but_the_reader_reads_the_environment() -> None:
    """Settings come through core/env.py: no other module reads os.environ or getenv (setdefault writes are fine)."""
    offenders = []
    for path in _source_files():
        if path == ROOT / "core" / "env.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"os\.environ(?!\.setdefault)|getenv\(", line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("DEBUG", "maybe", "Bad setting DEBUG: expected true/false"),
        ("FANOUT_LANES", "two", "Bad setting FANOUT_LANES: expected a whole number."),
        ("NOTIFIER_CATEGORIES", '{"security": ', "Bad setting NOTIFIER_CATEGORIES: expected JSON."),
        ("RETRY_BACKOFF_BASE_SECONDS", "soon", "Bad setting RETRY_BACKOFF_BASE_SECONDS: expected a number."),
    ],
)
def test_a_bad_value_stops_manage_py_with_one_line_naming_the_variable(
    variable: str, value: str, expected: str
) -> None:
    """No traceback: one line on stderr that names the variable (and not the value, which may be a secret)."""
    env = {**os.environ, "DEVELOPMENT": "true", "DJANGO_SETTINGS_MODULE": "config.settings", variable: value}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(expected), lines[0]
    assert value not in lines[0]
    assert "Traceback" not in done.stderr + done.stdout


def test_an_empty_value_means_the_default() -> None:
    """`FOO=` (as compose files and manifests often write) is unset, not false and not a crash."""
    env = {**os.environ, "DEVELOPMENT": "true", "DJANGO_SETTINGS_MODULE": "config.settings"}
    env.update(PUBLISH_IN_BACKGROUND="", FANOUT_LANES=" ", NOTIFIER_CATEGORIES="")
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.PUBLISH_IN_BACKGROUND, s.FANOUT_LANES, sorted(s.NOTIFIER_CATEGORIES))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "True 2 ['marketing', 'security', 'social', 'transactional']"
