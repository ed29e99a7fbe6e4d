"""Create the "Support" and "Marketing" groups with their least-privilege permissions (notifier/staff/roles.py)."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def create_roles(apps: Any, schema_editor: Any) -> None:
    """Create the permissions now (Django would only after all migrations), then the groups."""
    from django.contrib.auth.management import create_permissions

    from notifier.staff.roles import ROLE_PERMISSIONS

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    group_model = apps.get_model("auth", "Group")
    permission_model = apps.get_model("auth", "Permission")
    for role, names in ROLE_PERMISSIONS.items():
        group, _ = group_model.objects.get_or_create(name=role)
        for name in names:
            app_label, codename = name.split(".")
            group.permissions.add(permission_model.objects.get(content_type__app_label=app_label, codename=codename))


def delete_roles(apps: Any, schema_editor: Any) -> None:
    """Remove the groups (their users stay, without the role)."""
    from notifier.staff.roles import ROLE_PERMISSIONS

    apps.get_model("auth", "Group").objects.filter(name__in=list(ROLE_PERMISSIONS)).delete()


class Migration(migrations.Migration):
    # Every app whose permissions a role holds: the groups are made once all their models exist.
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("campaigns", "0001_initial"),
        ("channels_app", "0001_initial"),
        ("deadletters", "0001_initial"),
        ("deliveries", "0002_partition_by_day"),
        ("preferences", "0001_initial"),
        ("templates_app", "0001_initial"),
        ("workflows", "0001_initial"),
    ]

    operations = [migrations.RunPython(create_roles, delete_roles)]
