"""Every migration expands the schema: the release before it keeps running against what it leaves.

A deploy runs the migrations first and replaces the processes one by one, so for a while the previous release's
API and workers read and write the new schema (docs/operations.md, "Deploys: expand, then contract"). That holds
when a migration only adds: a new column is nullable or has a database default (Django's `default` lives in
Python, so the previous release's INSERT, which does not name the column, would break a NOT NULL without one), no
column or table goes away or changes its name, and no column becomes NOT NULL. A step that removes what a
release no longer uses (the contract) ships one release after that release, and is listed in CONTRACTS with the
release that stopped using what it removes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.db import migrations
from django.db.migrations.loader import MigrationLoader

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parent.parent.parent
# (app, migration) -> why the previous release does not need what it removes. Empty: nothing was contracted yet.
CONTRACTS: dict[tuple[str, str], str] = {}
CONTRACTING = (
    migrations.RemoveField, migrations.DeleteModel, migrations.RenameField, migrations.RenameModel,
    migrations.AlterModelTable,
)  # fmt: skip


def _problems(loader: MigrationLoader, key: tuple[str, str]) -> list[str]:
    """Return what in one migration the release before it could not run against."""
    migration = loader.disk_migrations[key]
    before = loader.project_state(key, at_end=False)
    created = {op.name_lower for op in migration.operations if isinstance(op, migrations.CreateModel)}
    found = []
    for op in migration.operations:
        where = f"{key[0]}.{key[1]}: {op.describe()}"
        if isinstance(op, CONTRACTING):
            found.append(f"{where} removes or renames what the previous release uses")
        elif isinstance(op, migrations.AddField) and op.model_name_lower not in created:
            field: Any = op.field
            if not field.null and not field.has_db_default():
                found.append(f"{where} is NOT NULL without a database default (db_default)")
        elif isinstance(op, migrations.AlterField):
            old: Any = before.models[key[0], op.model_name_lower].fields.get(op.name)
            if old is not None and old.null and not op.field.null:
                found.append(f"{where} makes a nullable column NOT NULL")
    return found


def _own_migrations(loader: MigrationLoader) -> list[tuple[str, str]]:
    """Return the migrations of this repository's apps (not Django's nor a library's)."""
    own = {
        config.label for config in apps.get_app_configs()
        if Path(config.path).is_relative_to(ROOT) and "site-packages" not in Path(config.path).parts
    }  # fmt: skip
    return sorted(key for key in loader.disk_migrations if key[0] in own)


def test_every_migration_only_expands_the_schema() -> None:
    """No migration of ours removes, renames or tightens what the previous release reads and writes."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    keys = _own_migrations(loader)
    assert len(keys) > 10, keys  # the loader found the project's migrations, not none
    problems = [p for key in keys if key not in CONTRACTS for p in _problems(loader, key)]
    assert not problems, problems


def test_the_check_refuses_a_contracting_migration() -> None:
    """A migration that drops a column or adds a NOT NULL column without a database default is refused."""
    from django.db import models

    loader = MigrationLoader(None, ignore_no_migrations=True)
    latest = max(name for app, name in _own_migrations(loader) if app == "preferences")
    bad = type(
        "Migration",
        (migrations.Migration,),
        {
            "dependencies": [("preferences", latest)],
            "operations": [
                migrations.RemoveField("recipient", "locale"),
                migrations.AddField("recipient", "nickname", models.CharField(max_length=20, default="")),
                migrations.AddField("recipient", "badge", models.CharField(max_length=20, db_default="")),
            ],
        },
    )("9999_contract", "preferences")
    loader.disk_migrations["preferences", "9999_contract"] = bad
    loader.graph.add_node(("preferences", "9999_contract"), bad)
    loader.graph.add_dependency(bad, ("preferences", "9999_contract"), ("preferences", latest))
    problems = _problems(loader, ("preferences", "9999_contract"))
    assert len(problems) == 2, problems
    assert "removes or renames" in problems[0] and "without a database default" in problems[1]
