"""The test databases' template: named by what it holds, used by every test database."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.testdb import PREFIX, template_name


@pytest.mark.pure
def test_the_template_is_named_by_its_migrations_requirements_and_day(tmp_path: Path) -> None:
    """A changed migration, a changed lock file or another day names another template; the virtualenv does not."""
    (tmp_path / "app" / "migrations").mkdir(parents=True)
    migration = tmp_path / "app" / "migrations" / "0001_initial.py"
    migration.write_text("operations = []\n")
    (tmp_path / "requirements.txt").write_text("django==5.2\n")
    day = datetime(2026, 12, 7, 23, 59, tzinfo=UTC)
    first = template_name(day, tmp_path)
    assert first.startswith(f"{PREFIX}20261207_")
    assert len(first) <= 63  # PostgreSQL's identifier limit

    venv = tmp_path / ".venv" / "lib" / "pkg" / "migrations"
    venv.mkdir(parents=True)
    (venv / "0001_initial.py").write_text("operations = ['other']\n")
    assert template_name(day, tmp_path) == first  # an installed package's copy is the lock file's business

    migration.write_text("operations = ['a table']\n")
    changed = template_name(day, tmp_path)
    assert changed != first
    (tmp_path / "requirements.txt").write_text("django==5.3\n")
    assert template_name(day, tmp_path) != changed
    assert template_name(datetime(2026, 12, 8, 0, 1, tzinfo=UTC), tmp_path)[len(PREFIX) : len(PREFIX) + 8] == "20261208"


@pytest.mark.django_db
def test_this_test_database_was_copied_from_the_template_and_holds_every_migration() -> None:
    """The running test database names today's template, which exists, and nothing is left to migrate."""
    template = settings.DATABASES["default"]["TEST"]["TEMPLATE"]
    assert template.startswith(PREFIX) and template[-12:] == template_name()[-12:]  # the day may have turned since
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [template])
        assert cursor.fetchone() == (1,)
    executor = MigrationExecutor(connection)
    assert executor.migration_plan(executor.loader.graph.leaf_nodes()) == []
