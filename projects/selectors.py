"""Reads of projects and their environments."""

from __future__ import annotations

from projects.models import DEFAULT_PROJECT_SLUG, Environment


class ProjectNotFound(Exception):
    """No project has the slug asked for."""


def environment_of(*, project: str = DEFAULT_PROJECT_SLUG, mode: str) -> Environment:
    """Return the `mode` environment (test or live) of the project with slug `project`, or raise ProjectNotFound."""
    found = Environment.objects.select_related("project").filter(project__slug=project, name=mode).first()
    if found is None:
        raise ProjectNotFound(f"unknown project '{project}'")
    return found
