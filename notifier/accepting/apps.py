"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class AcceptingConfig(AppConfig):
    """Configure the Accepting app."""

    name = "notifier.accepting"
    label = "accepting"
    verbose_name = "Accepting"
    default_auto_field = "django.db.models.BigAutoField"
