"""Writes of projects: creating one with its two environments."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import connections, transaction

from projects.models import (
    DEFAULT_LIVE_ENVIRONMENT_ID,
    DEFAULT_PROJECT_SLUG,
    DEFAULT_TEST_ENVIRONMENT_ID,
    Environment,
    Project,
)


def project_create(*, slug: str, name: str = "") -> Project:
    """Create a project with its `test` and `live` environments; raise ValueError if the slug is taken."""
    try:
        validate_slug(slug)
    except ValidationError:
        raise ValueError(f"'{slug}' is not a slug (letters, digits, hyphens and underscores)") from None
    if Project.objects.filter(slug=slug).exists():
        raise ValueError(f"a project '{slug}' already exists")
    with transaction.atomic():
        project = Project.objects.create(slug=slug, name=name or slug)
        Environment.objects.bulk_create([Environment(project=project, name=name) for name in Environment.Name.values])
    return project


def default_project_ensure(*, apps: Any = None, using: str = "default", **signal: Any) -> None:
    """Make the project `default` and its environments (ids 1 live, 2 test) if they are missing; idempotent.

    The migration makes them; this keeps them after anything that empties the tables (a test database flushed
    between tests, `manage.py flush`), since every row made outside a scope belongs there. Run after each
    migrate (post_migrate, which passes the migrated state as `apps`), as Django keeps its content types and
    permissions; a migrate that stops before the projects' tables exist leaves it nothing to do.
    """
    try:
        project_model = apps.get_model("projects", "Project") if apps is not None else Project
        environment_model = apps.get_model("projects", "Environment") if apps is not None else Environment
    except LookupError:
        return
    project, _ = project_model.objects.using(using).get_or_create(
        id=1, defaults={"slug": DEFAULT_PROJECT_SLUG, "name": "Default project"}
    )
    for environment_id, name in ((DEFAULT_LIVE_ENVIRONMENT_ID, "live"), (DEFAULT_TEST_ENVIRONMENT_ID, "test")):
        environment_model.objects.using(using).get_or_create(
            id=environment_id, defaults={"project": project, "name": name}
        )
    with connections[using].cursor() as cursor:
        # Ids given by hand: the sequences continue after them (a flush may have restarted them).
        for table in ("projects_project", "projects_environment"):
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"  # noqa: S608
            )
