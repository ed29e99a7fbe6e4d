"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class CoreConfig(AppConfig):
    """Configure the Core app."""

    name = "core"
    label = "core"
    verbose_name = "Core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: the checks read settings; the Django instrumentation adds its middleware before any
        # request is served or task run.
        from core import checks  # noqa: F401 - registers the start-up checks
        from core.converters import register
        from core.tracing import instrument

        instrument()
        # Before any URLconf is imported (the first request, or `reverse`), which names `<id:...>`.
        register()
