"""App configuration."""

from __future__ import annotations

from celery.signals import worker_init
from django.apps import AppConfig

from channels_app import checks
from channels_app.providers.registry import PROVIDER_CLASSES
from preferences.signals import recipient_erased


class ChannelsAppConfig(AppConfig):
    """Configure the channels app: provider checks at start-up, its provider names, its part of an erasure."""

    name = "channels_app"
    verbose_name = "Channels"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: these modules import models, which need the app registry ready.
        from channels_app.erasure import sandbox_forget_recipient
        from notifier.deliveries.selectors import register_provider_names

        worker_init.connect(checks.check_providers_on_worker_start, weak=False)
        register_provider_names(PROVIDER_CLASSES)
        recipient_erased.connect(sandbox_forget_recipient, dispatch_uid="channels_app.erasure")
