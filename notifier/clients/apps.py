"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class ClientsConfig(AppConfig):
    """Configure the API clients app."""

    name = "notifier.clients"
    label = "clients"
    verbose_name = "API clients"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: models need the app registry ready.
        from core.config_cache import invalidate_on_change
        from notifier.clients.models import ApiClient

        invalidate_on_change(ApiClient)
