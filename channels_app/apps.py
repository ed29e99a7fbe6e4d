"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class ChannelsAppConfig(AppConfig):
    """Configure the channels_app app."""

    name = "channels_app"
    default_auto_field = "django.db.models.BigAutoField"
