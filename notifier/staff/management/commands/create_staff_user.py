"""Create a staff user in a role: `manage.py create_staff_user NAME --role R [--project SLUG] [--email E]`.

The role is `support` or `marketing`. With `--project`, the user is a member of that project in that role (and
of no group: a member's role is per project, docs/admin.md "Projects and roles"); without, the user is in the
role's group, which applies to the project `default`.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from audit.services import SYSTEM, audit_record
from core.env import env
from notifier.staff.roles import ROLES
from notifier.staff.services import staff_roles_sync
from projects.models import Membership, Project

PASSWORD_ENV = "STAFF_USER_PASSWORD"


class Command(BaseCommand):
    """Create a staff user (not a superuser) in the Support or Marketing group."""

    help = (
        f"Create a staff user in a role. The password comes from ${PASSWORD_ENV}, or a one-time password is "
        "generated and printed once (the user should change it)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--role", required=True, choices=sorted(ROLES))
        parser.add_argument("--project", default="", help="Make the user a member of this project in the role.")
        parser.add_argument("--email", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        name, role = options["name"], ROLES[options["role"]]
        if User.objects.filter(username=name).exists():
            raise CommandError(f"A user named '{name}' exists already.")
        project = Project.objects.filter(slug=options["project"]).first() if options["project"] else None
        if options["project"] and project is None:
            raise CommandError(f"No project '{options['project']}'.")
        staff_roles_sync()
        group = Group.objects.get(name=role)
        password = env.str(PASSWORD_ENV)
        generated = not password
        if generated:
            password = secrets.token_urlsafe(12)
        with transaction.atomic():
            user = User.objects.create_user(name, email=options["email"], password=password, is_staff=True)
            if project is None:
                user.groups.add(group)
            else:
                Membership.objects.create(user=user, project=project, role=options["role"])
            audit_record(
                actor=SYSTEM,
                action="staff_user.create",
                target_type="user",
                target_id=user.pk,
                changes={
                    "username": [None, name],
                    "role": [None, role],
                    **({"project": [None, project.slug]} if project else {}),
                },
            )
        where = f" in project {project.slug}" if project else ""
        self.stdout.write(f"Created staff user '{name}' in role {role}{where}.")
        if generated:
            self.stdout.write(f"One-time password (shown once): {password}")
