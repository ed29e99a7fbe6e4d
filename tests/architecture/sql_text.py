"""Read the SQL text of the application's modules: which tables each statement writes, reads first, and names.

Shared by the ownership tests: a statement is any string constant of a module (f-string parts included) that
names a table of an installed app and reads like SQL.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from django.apps import apps

ROOT = Path(__file__).resolve().parents[2]
# The application's packages: everything that ships (tests, benchmarks and scripts are left out).
PACKAGES = ("notifier", "channels_app", "templates_app", "preferences", "projects", "audit", "ops", "core", "config")
# Tables created by migrations' SQL, not by a model, and their sequences: owned by the app whose migration made them.
SQL_ONLY_TABLES = {
    "notifier_dedupkey": "notifier.deliveries",
    "notifier_delivery_seq": "notifier.deliveries",
    "notifier_deliveryevent_seq": "notifier.deliveries",
}
_SQL_WORD = re.compile(r"\b(SELECT|UPDATE|INSERT|DELETE|FROM|JOIN|TABLE|INTO|INDEX|VACUUM|ANALYZE)\b", re.I)
_WRITE = re.compile(
    r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|ALTER\s+TABLE|CREATE\s+(?:UNIQUE\s+)?INDEX\s+\S+\s+ON(?:\s+ONLY)?|"
    r"TRUNCATE|DROP\s+TABLE(?:\s+IF\s+EXISTS)?)\s+\"?(\w+)",
    re.I,
)
_FROM = re.compile(r"\bFROM\s+\"?(\w+)", re.I)


def table_owners() -> dict[str, str]:
    """Return {table: the name of the app that owns it} for every model of an installed app, and the SQL-only ones."""
    owners = {m._meta.db_table: m._meta.app_config.name for m in apps.get_models(include_auto_created=True)}
    return {**owners, **SQL_ONLY_TABLES}


def app_of(module: str) -> str:
    """Return the installed app a module belongs to (the longest app name it starts with), or its top package."""
    names = sorted((config.name for config in apps.get_app_configs()), key=len, reverse=True)
    return next((name for name in names if module == name or module.startswith(name + ".")), module.split(".")[0])


def layer_ranks() -> dict[str, int]:
    """Return each package's and notifier app's rank in the import contract's layers (0 is the top).

    The global layers (config, ops, channels_app, notifier, preferences, …) with the notifier's own layers in
    the place of `notifier`; apps of one layer share its rank.
    """
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    by_id = {c["id"]: c for c in contracts}
    inner = [[f"notifier.{name.strip()}" for name in layer.split("|")] for layer in by_id["notifier-apps"]["layers"]]
    ranks: dict[str, int] = {}
    for layer in by_id["layers"]["layers"]:
        group = inner if layer == "notifier" else [[layer]]
        for names in group:
            rank = len(set(ranks.values()))
            for name in names:
                ranks[name] = rank
    return ranks


@dataclass(frozen=True)
class Statement:
    """One SQL text and where it is."""

    module: str
    line: int
    text: str
    written: frozenset[str]
    main: str | None
    named: frozenset[str]


def statements(owners: dict[str, str]) -> Iterator[Statement]:
    """Yield every SQL text of the application's modules that names a known table (migrations left out)."""
    known = re.compile(r"\b(" + "|".join(re.escape(t) for t in sorted(owners, key=len, reverse=True)) + r")\b")
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            tree = ast.parse(path.read_text(), str(path))
            # An f-string is one statement: its literal parts joined, its fields as "{}".
            inside = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
            for node in ast.walk(tree):
                if isinstance(node, ast.JoinedStr):
                    text = "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside:
                    text = node.value
                else:
                    continue
                named = frozenset(known.findall(text))
                if not named or not _SQL_WORD.search(text):
                    continue
                written = frozenset(t for t in _WRITE.findall(text) if t in owners)
                main = next((t for t in _FROM.findall(text) if t in owners), None)
                yield Statement(module, node.lineno, text, written, main, named)
