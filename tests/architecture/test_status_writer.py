"""One status writer: nothing but notifier.deliveries.status changes a delivery's status.

Every change of `notifier_delivery.status` goes with its event in the delivery history, written by the same
module; a raw UPDATE or a queryset `update(status=…)` anywhere else would change a status without it.
"""

from __future__ import annotations

import ast
import re

import pytest

from tests.architecture.sql_text import PACKAGES, ROOT, statements, table_owners

pytestmark = pytest.mark.pure

WRITER = "notifier.deliveries.status"
_SET_STATUS = re.compile(r"\bSET\b(?P<set>.*?)(?:\bWHERE\b|\bFROM\b|\bRETURNING\b|$)", re.I | re.S)


def sets_delivery_status(text: str) -> bool:
    """Return whether an UPDATE of notifier_delivery assigns `status` in its SET list."""
    for match in re.finditer(r"UPDATE\s+notifier_delivery\b(?P<rest>.*)", text, re.I | re.S):
        found = _SET_STATUS.search(match.group("rest"))
        if found and re.search(r"(?<![\w.])status\s*=", found.group("set")):
            return True
    return False


def _orm_status_updates(tree: ast.AST) -> list[int]:
    """Return the lines of `<Delivery queryset>.update(status=…)` and `bulk_update(…, ["status", …])` calls."""
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver = ast.unparse(node.func.value)
        if not re.search(r"\bDelivery\b", receiver):
            continue
        if node.func.attr == "update" and any(k.arg == "status" for k in node.keywords):
            lines.append(node.lineno)
        if node.func.attr == "bulk_update" and "'status'" in ast.unparse(node):
            lines.append(node.lineno)
    return lines


def test_only_the_status_writer_updates_a_delivery_status() -> None:
    raw = [
        f"{s.module}:{s.line}"
        for s in statements(table_owners())
        if "notifier_delivery" in s.written and sets_delivery_status(s.text) and s.module != WRITER
    ]
    orm = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if "migrations" in path.parts or module == WRITER:
                continue
            orm += [f"{module}:{line}" for line in _orm_status_updates(ast.parse(path.read_text()))]
    assert raw == []
    assert orm == []


def test_the_writer_is_where_the_statuses_change() -> None:
    """The check finds the writer's own statements: a pattern that matched nothing would pass anything."""
    own = [s for s in statements(table_owners()) if s.module == WRITER and sets_delivery_status(s.text)]
    assert len(own) >= 4
    source = (ROOT / "notifier" / "deliveries" / "status.py").read_text()
    assert _orm_status_updates(ast.parse(source))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("UPDATE notifier_delivery SET status = 'queued', updated_at = now() WHERE id = 1", True),
        ("UPDATE notifier_delivery AS d SET not_before = NULL FROM x WHERE d.status = 'pending'", False),
        ("UPDATE notifier_delivery SET claimed_at = now() WHERE id IN (SELECT id WHERE status = 'sending')", False),
        ("WITH c AS (UPDATE notifier_delivery AS d SET status = 'sending', attempts = 1 FROM t) SELECT 1", True),
        ("UPDATE notifier_deliveryevent SET status = 'x'", False),
    ],
)
def test_a_status_assignment_is_told_from_a_status_condition(text: str, expected: bool) -> None:
    assert sets_delivery_status(text) is expected


def test_an_orm_status_update_of_deliveries_is_seen() -> None:
    tree = ast.parse(
        "Delivery.objects.filter(pk=1).update(status='sent')\n"
        "Notification.objects.filter(pk=1).update(status='done')\n"
        "Delivery.objects.filter(pk=1).update(read_at=None)\n"
        "Delivery.objects.bulk_update(rows, ['status'])\n"
    )
    assert _orm_status_updates(tree) == [1, 4]
