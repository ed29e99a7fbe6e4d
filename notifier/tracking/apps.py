"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class TrackingConfig(AppConfig):
    """Configure the Tracking app."""

    name = "notifier.tracking"
    label = "tracking"
    verbose_name = "Tracking"
    default_auto_field = "django.db.models.BigAutoField"
