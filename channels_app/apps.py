"""App configuration."""

from __future__ import annotations

from celery.signals import worker_init
from django.apps import AppConfig


class ChannelsAppConfig(AppConfig):
    """Configure the channels app: provider checks at start-up."""

    name = "channels_app"
    verbose_name = "Channels"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Here, not at the top: these import models, which need the app registry ready.
        from channels_app import checks
        from channels_app.providers.registry import PROVIDER_CLASSES
        from notifier.selectors import register_provider_names

        worker_init.connect(checks.check_providers_on_worker_start, weak=False)
        register_provider_names(PROVIDER_CLASSES)
