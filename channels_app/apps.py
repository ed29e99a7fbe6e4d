"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class ChannelsAppConfig(AppConfig):
    """Configure the channels app: provider checks at start-up."""

    name = "channels_app"
    verbose_name = "Channels"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from celery.signals import worker_init

        from channels_app import checks

        worker_init.connect(checks.check_providers_on_worker_start, weak=False)
