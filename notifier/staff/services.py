"""Writes of the staff tools: the staff roles' groups."""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission

from notifier.staff.roles import ROLE_PERMISSIONS


def staff_roles_sync() -> None:
    """Create the Support and Marketing groups with their permissions if missing (idempotent).

    The data migration notifier/staff/migrations/0001_roles.py creates them; create_staff_user calls this too, so a
    database whose
    groups were flushed (or deleted by hand) gets them back with exactly the permissions of notifier/staff/roles.py.
    """
    for role, names in ROLE_PERMISSIONS.items():
        group, created = Group.objects.get_or_create(name=role)
        if created:
            wanted = [name.split(".") for name in names]
            perms = Permission.objects.filter(codename__in=[codename for _, codename in wanted]).select_related(
                "content_type"
            )
            by_name = {(p.content_type.app_label, p.codename): p for p in perms}
            group.permissions.add(*[by_name[(app, codename)] for app, codename in wanted])
