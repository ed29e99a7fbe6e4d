"""Reads of projects and their environments."""

from __future__ import annotations

from projects.models import DEFAULT_PROJECT_SLUG, Environment, Project


class ProjectNotFound(Exception):
    """No project has the slug asked for."""


def environment_of(*, project: str = DEFAULT_PROJECT_SLUG, mode: str) -> Environment:
    """Return the `mode` environment (test or live) of the project with slug `project`, or raise ProjectNotFound."""
    found = Environment.objects.select_related("project").filter(project__slug=project, name=mode).first()
    if found is None:
        raise ProjectNotFound(f"unknown project '{project}'")
    return found


def project_environment_ids(*, environment_id: int) -> tuple[int, int]:
    """Return the ids of the `test` and `live` environments of the project `environment_id` belongs to."""
    project_id = Environment.objects.filter(pk=environment_id).values_list("project_id", flat=True).get()
    ids = dict(Environment.objects.filter(project_id=project_id).values_list("name", "pk"))
    return ids[Environment.Name.TEST], ids[Environment.Name.LIVE]


def promotion_required(*, environment_id: int) -> Project | None:
    """Return the project of `environment_id` if it is a live environment changed only by promotion, else None."""
    found = (
        Environment.objects.select_related("project")
        .filter(pk=environment_id, name=Environment.Name.LIVE, project__promotion=Project.Promotion.REQUIRED)
        .first()
    )
    return found.project if found is not None else None
