"""Writes of projects: creating one with its two environments."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import transaction

from projects.models import Environment, Project


def project_create(*, slug: str, name: str = "") -> Project:
    """Create a project with its `test` and `live` environments; raise ValueError if the slug is taken."""
    try:
        validate_slug(slug)
    except ValidationError:
        raise ValueError(f"'{slug}' is not a slug (letters, digits, hyphens and underscores)") from None
    if Project.objects.filter(slug=slug).exists():
        raise ValueError(f"a project '{slug}' already exists")
    with transaction.atomic():
        project = Project.objects.create(slug=slug, name=name or slug)
        Environment.objects.bulk_create([Environment(project=project, name=name) for name in Environment.Name.values])
    return project
