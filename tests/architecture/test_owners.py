"""Every row has an owner: each model carries its project environment or reaches it through its parent, and raw
SQL that finds rows by a caller's name for them (a user id, a key, an address) names the owner too.

projects.scoping says how owned rows are read and written; projects.ownership lists what is installation-wide.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.apps import apps
from django.db import models

from projects.ownership import INSTALLATION_WIDE, OWNED_WITHOUT_SCOPE
from projects.scoping import OwnedManager
from tests.architecture.sql_text import Statement, statements, table_owners

pytestmark = pytest.mark.pure

APP_PACKAGES = ("notifier", "channels_app", "templates_app", "preferences", "projects", "audit", "core", "ops")


def _project_models() -> list[type[models.Model]]:
    return [m for m in apps.get_models() if m.__module__.split(".")[0] in APP_PACKAGES]


def _owner_column(model: type[models.Model], path: str) -> models.Field[Any, Any] | None:
    """Follow `path` (`template__environment_id`) through the model's relations to the owner column, or None."""
    *hops, column = path.split("__")
    for hop in hops:
        field = model._meta.get_field(hop)
        if not field.is_relation or field.related_model is None:
            return None
        model = field.related_model
    found = next((f for f in model._meta.concrete_fields if f.attname == column), None)
    if found is None or not found.is_relation or found.related_model is None:
        return None
    return found if found.related_model._meta.label == "projects.Environment" else None


def owner_problems(model: type[models.Model]) -> list[str]:
    """Return why `model` has no owner (empty: it is owned, or installation-wide by name)."""
    label = model._meta.label
    if label in INSTALLATION_WIDE:
        return []
    if label in OWNED_WITHOUT_SCOPE:
        return [] if _owner_column(model, OWNED_WITHOUT_SCOPE[label] + "_id") else [f"{label}: no owner column"]
    manager = model._default_manager
    if not isinstance(manager, OwnedManager):
        return [f"{label}: neither owned (an OwnedManager) nor installation-wide (projects.ownership)"]
    if _owner_column(model, manager.owner_path) is None:
        return [f"{label}: its owner_path {manager.owner_path!r} does not lead to a projects.Environment column"]
    return []


def test_every_model_has_an_owner_or_is_installation_wide_by_name() -> None:
    found = _project_models()
    assert len(found) > 25  # the project's models are all seen (a broken filter would check none and pass)
    assert [problem for model in found for problem in owner_problems(model)] == []


def test_the_check_refuses_a_model_without_an_owner() -> None:
    audit = apps.get_model("audit", "AuditEntry")
    assert owner_problems(audit) == []  # named as installation-wide
    del INSTALLATION_WIDE["audit.AuditEntry"]
    try:
        assert owner_problems(audit) == ["audit.AuditEntry: neither owned (an OwnedManager) nor installation-wide "
                                         "(projects.ownership)"]  # fmt: skip
    finally:
        INSTALLATION_WIDE["audit.AuditEntry"] = "restored"


def _owned_tables() -> set[str]:
    tables = {m._meta.db_table for m in _project_models() if not owner_problems(m)}
    tables -= {apps.get_model(label)._meta.db_table for label in INSTALLATION_WIDE}
    # Owned through its client: its keys are unique per (client, dedup_key).
    return tables | {"notifier_dedupkey"}


# A caller's own names for rows, unique only within an owner: a statement matching rows by one of them must also
# match the owner (its environment), or an owned row they belong to (a client, a workflow, a recipient, ...: each
# belongs to one environment).
_NATURAL_KEY = re.compile(r"\b(user_id|key|address|dedup_key|token|email|phone)\s*(=|IN\b|LIKE\b)", re.I)
_OWNER = re.compile(
    r"\b(environment_id|client_id|workflow_id|topic_id|template_id|layout_id|recipient_id|notification_id)\b"
)
# The schema's own statements (the partitions' indexes) find no rows.
_DDL = re.compile(r"\s*(CREATE|ALTER|DROP)\b", re.I)


def natural_key_problems(statement: Statement, owned: set[str]) -> list[str]:
    """Return a problem if the statement finds rows of an owned table by a natural key without naming the owner."""
    if _DDL.match(statement.text) or not statement.named & owned:
        return []
    if not _NATURAL_KEY.search(statement.text) or _OWNER.search(statement.text):
        return []
    return [f"{statement.module}:{statement.line} matches {sorted(statement.named & owned)} by a natural key "
            "without the owner"]  # fmt: skip


def test_raw_sql_finding_rows_by_a_natural_key_names_the_owner() -> None:
    owned = _owned_tables()
    found = list(statements(table_owners()))
    assert len(found) > 50
    assert sum(1 for s in found if s.named & owned) > 40  # the owned tables' statements are seen
    assert [p for s in found for p in natural_key_problems(s, owned)] == []


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("SELECT id FROM preferences_recipient r WHERE r.user_id = ANY(%s)", True),
        ("SELECT id FROM preferences_recipient r WHERE r.environment_id = %s AND r.user_id = ANY(%s)", False),
        ("SELECT s.channel FROM preferences_suppression s WHERE s.address = %s", True),
        ("SELECT id FROM notifier_dedupkey WHERE client_id = %s AND dedup_key = %s", False),
        # By ids handed over from owned rows: the ids are the owner's already.
        ("UPDATE notifier_delivery SET status = %s WHERE id = ANY(%s)", False),
    ],
)
def test_the_sql_rule_refuses_what_it_should(text: str, refused: bool) -> None:
    owners = table_owners()
    named = frozenset(t for t in owners if re.search(rf"\b{t}\b", text))
    probe = Statement(module="probe", line=1, text=text, written=frozenset(), main=None, named=named)
    assert bool(natural_key_problems(probe, _owned_tables())) is refused
