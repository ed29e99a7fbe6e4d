"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class CallbacksConfig(AppConfig):
    """Configure the Provider callbacks app."""

    name = "notifier.callbacks"
    label = "callbacks"
    verbose_name = "Provider callbacks"
    default_auto_field = "django.db.models.BigAutoField"
