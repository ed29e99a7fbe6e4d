"""One owner per table: SQL text lives in the app that owns the table it writes or reads from.

A statement may write only its own app's tables; a statement that writes nothing reads FROM its own app's
tables. Besides those it may name (JOIN, EXISTS, a subquery) the tables of the apps below its own in the import
contract's layers, which its app may import anyway. Another app's rows are reached through that app's
functions, so the import contract sees every dependency on a table.
"""

from __future__ import annotations

import pytest

from tests.architecture.sql_text import Statement, app_of, layer_ranks, statements, table_owners

pytestmark = pytest.mark.pure


def _problems(statement: Statement, owners: dict[str, str], ranks: dict[str, int]) -> list[str]:
    app = app_of(statement.module)
    rank = ranks.get(app, ranks.get(app.split(".")[0]))
    where = f"{statement.module}:{statement.line}"
    problems = [f"{where} writes {t}, owned by {owners[t]}" for t in sorted(statement.written) if owners[t] != app]
    # A read is its main table's owner's; a write may read what it writes from the apps below (its JOINs).
    if not statement.written and statement.main is not None and owners[statement.main] != app:
        problems.append(f"{where} reads from {statement.main}, owned by {owners[statement.main]}")
    for table in sorted(statement.named - statement.written - {statement.main}):
        owner = owners[table]
        owner_rank = ranks.get(owner, ranks.get(owner.split(".")[0]))
        if owner != app and (rank is None or owner_rank is None or owner_rank <= rank):
            problems.append(f"{where} names {table}, owned by {owner}, which is not below {app}")
    return problems


def test_sql_names_only_the_tables_its_app_owns_or_may_import() -> None:
    owners = table_owners()
    ranks = layer_ranks()
    found = list(statements(owners))
    assert len(found) > 50  # the reader finds the project's SQL (a broken pattern would find none and pass)
    problems = [problem for statement in found for problem in _problems(statement, owners, ranks)]
    assert problems == []


@pytest.mark.parametrize(
    ("module", "text", "expected"),
    [
        # A fan-out statement in dispatch reading a device table of preferences, below it: allowed as a JOIN only.
        ("notifier.dispatch.fanout", "SELECT 1 FROM notifier_fanoutlane l JOIN preferences_device d ON true", []),
        (
            "notifier.dispatch.fanout",
            "SELECT token FROM preferences_device WHERE recipient_id = ANY(%s)",
            ["reads from preferences_device"],
        ),
        ("channels_app.outcomes", "UPDATE notifier_delivery SET status = %s", ["writes notifier_delivery"]),
        # Dead letters sit above the delivery log: it may not even name them in its own statements.
        (
            "notifier.deliveries.partitions",
            "DELETE FROM notifier_delivery d WHERE EXISTS (SELECT 1 FROM notifier_deadletter x WHERE true)",
            ["names notifier_deadletter"],
        ),
    ],
)
def test_the_rule_refuses_what_it_should(module: str, text: str, expected: list[str]) -> None:
    owners = table_owners()
    probe = Statement(
        module=module,
        line=1,
        text=text,
        written=frozenset(t for t in owners if f"UPDATE {t} " in text or f"INTO {t} " in text or f"FROM {t} d" in text),
        main=next((t for t in owners if f"FROM {t} " in text), None),
        named=frozenset(t for t in owners if t in text.split() or f"{t}," in text),
    )
    found = _problems(probe, owners, layer_ranks())
    assert len(found) == len(expected)
    for problem, fragment in zip(found, expected, strict=True):
        assert fragment in problem
