"""A test that changes a Django setting changes it through pytest-django's `settings` fixture.

The suite runs on a few long-lived workers, so a setting a test assigns on `django.conf.settings` and sets back
by hand to a value it guessed leaks into every later test of that worker (a lease of 300 s instead of the shipped
30 s failed a fault test three files later). The fixture puts back what was there, whatever the test did. Outside
tests/conftest.py (which sets the run's broker and prefixes once, before any test) an assignment to an upper-case
attribute of `settings` is allowed only in a function that takes `settings` as a parameter, or in a function
defined inside one (a helper of the test that closes over the fixture).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ALLOWED = {TESTS / "conftest.py"}


def _params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Return the names of a function's parameters."""
    args = func.args
    return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}


def _unscoped_assignments(tree: ast.Module) -> list[int]:
    """Return the lines that assign `settings.NAME` where no enclosing function takes `settings`."""
    found: list[int] = []

    def visit(node: ast.AST, fixture_in_scope: bool) -> None:
        for child in ast.iter_child_nodes(node):
            scope = fixture_in_scope
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                scope = fixture_in_scope or "settings" in _params(child)
            if isinstance(child, ast.Assign | ast.AugAssign):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "settings"
                        and target.attr.isupper()
                        and not scope
                    ):
                        found.append(child.lineno)
            visit(child, scope)

    visit(tree, False)
    return found


def test_settings_are_changed_only_through_the_fixture() -> None:
    """Every test module assigns settings only where pytest-django's fixture will restore them."""
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        if path in ALLOWED:
            continue
        for line in _unscoped_assignments(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(TESTS.parent)}:{line}")
    assert not offenders, offenders


def test_the_check_catches_a_hand_restored_setting() -> None:
    """A module-level `settings` assigned in a test without the fixture is found; with the fixture it is not."""
    leaking = ast.parse(
        "from django.conf import settings\n"
        "def test_x():\n"
        "    settings.SENDING_LEASE_SECONDS = 4\n"
        "    try:\n        pass\n    finally:\n        settings.SENDING_LEASE_SECONDS = 300\n"
    )
    assert _unscoped_assignments(leaking) == [3, 7]
    scoped = ast.parse(
        "def test_x(settings):\n    settings.SENDING_LEASE_SECONDS = 4\n"
        "    def helper():\n        settings.DEBUG = True\n"
    )
    assert _unscoped_assignments(scoped) == []
