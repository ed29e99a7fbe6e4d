"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class NotifierConfig(AppConfig):
    """Configure the notifier app."""

    name = "notifier"
    verbose_name = "Notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core.tracing import instrument

        # Imported for their registrations, once the app registry is ready (models load with it).
        from notifier import (
            checks,  # noqa: F401 - registers the start-up checks
            config_cache,
            strategy,  # noqa: F401 - registers its transition listener (notifier.events)
        )

        config_cache.connect()
        # Before any request is served or task run: the Django instrumentation adds its middleware here.
        instrument()
