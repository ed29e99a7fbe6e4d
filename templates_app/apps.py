"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class TemplatesAppConfig(AppConfig):
    """Configure the templates_app app."""

    name = "templates_app"
    verbose_name = "Templates"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: models need the app registry ready.
        from core.config_cache import invalidate_on_change
        from templates_app.models import Layout, LayoutVersion, Template, TemplateVersion

        # Layouts too: a send worker keeps renderings laid out with the layout's newest version
        # (channels_app/renderings.py) until the generation moves.
        invalidate_on_change(Template, TemplateVersion, Layout, LayoutVersion)
