"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class ProjectsConfig(AppConfig):
    """Configure the projects app: the owners of everything an API key makes or reads."""

    name = "projects"
    verbose_name = "Projects"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: models need the app registry ready.
        from core.config_cache import invalidate_on_change
        from projects.models import Environment, Project

        invalidate_on_change(Project)
        invalidate_on_change(Environment)
        # Imported here too: services import models.
        from django.db.models.signals import post_migrate

        from projects.services import default_project_ensure

        post_migrate.connect(default_project_ensure, sender=self)
