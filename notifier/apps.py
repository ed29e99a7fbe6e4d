"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig

from core.tracing import instrument
from preferences.signals import recipient_erased


class NotifierConfig(AppConfig):
    """Configure the notifier app."""

    name = "notifier"
    verbose_name = "Notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: these modules import models, which need the app registry ready.
        from notifier import (
            checks,  # noqa: F401 - registers the start-up checks
            config_cache,
            strategy,  # noqa: F401 - registers its transition listener (notifier.events)
        )
        from notifier.erasure import deliveries_forget_recipient

        config_cache.connect()
        recipient_erased.connect(deliveries_forget_recipient, dispatch_uid="notifier.erasure")
        # Before any request is served or task run: the Django instrumentation adds its middleware here.
        instrument()
