"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class PreferencesConfig(AppConfig):
    """Configure the preferences app."""

    name = "preferences"
    verbose_name = "Recipients and preferences"
    default_auto_field = "django.db.models.BigAutoField"
