"""Test databases copied from one migrated template instead of each migrated from nothing.

Every pytest process (each xdist worker, the serial phase) needs its own test database with every migration
applied. Migrating one costs 15 to 30 s of a loaded 2-core machine, three or four times a run. PostgreSQL copies a
database from a template in well under a second, so the first process to need it migrates a template once, under
an advisory lock the others wait on, and every test database is created from it (Django's `TEST["TEMPLATE"]`);
Django's own migrate on the copy then finds nothing to apply.

The template is named by what its contents depend on: the migration files, the locked requirements (third-party
apps' migrations), the UTC day and the partitioning settings (the initial migration makes the day's partitions
and the days ahead). It is kept between runs, so a run whose migrations are unchanged since the last one that
day migrates nothing at all; templates of earlier days are dropped. A build that dies half-way leaves a database
under another name, never a template that looks finished.
"""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.db import connections

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "notifier_tpl_"
_LOCK_KEY = 0x6E6F746966696572  # "notifier": one template build at a time on this server


def template_name(today: datetime | None = None, root: Path = ROOT) -> str:
    """Return the name of the template for the checkout's migrations and today's partitions."""
    digest = hashlib.sha256()
    for path in _migration_files(root):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    digest.update((root / "requirements.txt").read_bytes())
    for name in ("PARTITIONS_AHEAD_DAYS", "DELIVERY_HOT_DAYS"):
        digest.update(f"{name}={getattr(settings, name, '')}".encode())
    day = (today or datetime.now(UTC)).strftime("%Y%m%d")
    return f"{PREFIX}{day}_{digest.hexdigest()[:12]}"


def _migration_files(root: Path) -> list[Path]:
    """Return the checkout's own migration files, sorted; installed packages are the lock file's business.

    Walks the tree without entering hidden directories (the virtualenv, caches) or node_modules: a glob over all of
    it took 0.9 s a process.
    """
    found: list[Path] = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if not d.startswith(".") and d != "node_modules"]
        if Path(directory).name == "migrations":
            found.extend(Path(directory) / f for f in files if f.startswith("0") and f.endswith(".py"))
    return sorted(found)


def _maintenance(db: dict[str, Any]) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host=db["HOST"] or None, port=db["PORT"] or None, user=db["USER"], password=db["PASSWORD"] or None,
        dbname="postgres", autocommit=True,
    )  # fmt: skip


def use_migrated_template(alias: str = "default") -> str:
    """Make sure the migrated template exists (building it if not) and have `alias`'s test database copy it.

    Returns the template's name. Call before pytest-django creates the test databases, with database access
    allowed.
    """
    db = settings.DATABASES[alias]
    name = template_name()
    with _maintenance(db) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", [_LOCK_KEY])
        try:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if not exists:
                _build(alias, name, conn)
            _drop_stale(conn)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", [_LOCK_KEY])
    db["TEST"]["TEMPLATE"] = name
    connections[alias].settings_dict["TEST"]["TEMPLATE"] = name
    return name


def _build(alias: str, name: str, conn: psycopg.Connection[Any]) -> None:
    """Migrate a fresh database under a building name, then rename it to `name` (call with the lock held)."""
    building = f"{name}_building"
    connection = connections[alias]
    test = connection.settings_dict["TEST"]
    original = (settings.DATABASES[alias]["NAME"], connection.settings_dict["NAME"], test["NAME"], test.get("TEMPLATE"))
    test["NAME"], test["TEMPLATE"] = building, None
    try:
        # Django's own test-database creation, so the template holds exactly what a migrated test database does.
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False, keepdb=False)
    finally:
        connection.close()
        settings.DATABASES[alias]["NAME"], connection.settings_dict["NAME"], test["NAME"], test["TEMPLATE"] = original
    conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')


def _drop_stale(conn: psycopg.Connection[Any]) -> None:
    """Drop templates (and broken builds) of days before yesterday: no run of today copies them."""
    keep_from = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y%m%d")
    rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [PREFIX + "%"]).fetchall()
    for (datname,) in rows:
        if datname[len(PREFIX) : len(PREFIX) + 8] < keep_from:
            conn.execute(f'DROP DATABASE IF EXISTS "{datname}" WITH (FORCE)')
