"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class TemplatesAppConfig(AppConfig):
    """Configure the templates_app app."""

    name = "templates_app"
    verbose_name = "Templates"
    default_auto_field = "django.db.models.BigAutoField"
