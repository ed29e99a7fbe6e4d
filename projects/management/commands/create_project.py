"""Create a project with its test and live environments.

`python manage.py create_project SLUG [--name "…"]`; then `create_api_client NAME --project SLUG [--test]`.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from projects.services import project_create


class Command(BaseCommand):
    """Create a project (one product or team) with its `test` and `live` environments."""

    help = "Create a project with its test and live environments."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="", help="A readable name (default: the slug).")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            project = project_create(slug=options["slug"], name=options["name"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"project {project.slug}: environments test and live")
