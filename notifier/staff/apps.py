"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class StaffConfig(AppConfig):
    """Configure the Staff tools app."""

    name = "notifier.staff"
    label = "staff"
    verbose_name = "Staff tools"
    default_auto_field = "django.db.models.BigAutoField"
