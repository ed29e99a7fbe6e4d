"""Reads of projects and their environments."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from django.db import models

from core import provider_accounts
from core.config_cache import cached
from projects.models import DEFAULT_PROJECT_SLUG, Environment, Project

logger = logging.getLogger(__name__)


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


def owner_path_of(model: type[models.Model]) -> str | None:
    """Return the lookup of an owned model's environment id (`environment_id`, `client__environment_id`), or None.

    None: the model is not owned (projects, configuration, the audit log).
    """
    path = getattr(model._default_manager, "owner_path", None)
    if path is not None:
        return str(path)
    names = {field.name for field in model._meta.concrete_fields}
    # Owned without a narrowing manager (API clients: authentication reads every environment's keys).
    return "environment_id" if "environment" in names and model is not Environment else None


def environment_id_of(row: models.Model) -> int | None:
    """Return the environment id of an owned row, following its owner path through its parents (None: none)."""
    path = owner_path_of(type(row))
    if path is None:
        return None
    value: Any = row
    for name in path.split("__"):
        value = getattr(value, name, None)
        if value is None:
            return None
    return int(value)


def environment_project_id(environment_id: int) -> int | None:
    """Return the project of an environment (cached per process: an environment never changes project)."""

    def load() -> int | None:
        return Environment.objects.filter(pk=environment_id).values_list("project_id", flat=True).first()

    return cached("environment-project", str(environment_id), load)


def project_id_of(row: Any) -> tuple[bool, int | None]:
    """Return whether `row` belongs to projects at all, and the id of its project.

    (True, id) for a project, an environment or an owned row; (True, None) for an owned row without an owner
    (an installation-wide suppression); (False, None) for anything else.
    """
    if isinstance(row, Project):
        return True, row.pk
    if isinstance(row, Environment):
        return True, row.project_id
    if not isinstance(row, models.Model) or owner_path_of(type(row)) is None:
        return False, None
    environment_id = environment_id_of(row)
    return True, None if environment_id is None else environment_project_id(environment_id)


def default_project_id() -> int | None:
    """Return the id of the project `default` (what a staff user who is a member of no project sees)."""

    def load() -> int | None:
        return Project.objects.filter(slug=DEFAULT_PROJECT_SLUG).values_list("id", flat=True).first()

    return cached("default-project", DEFAULT_PROJECT_SLUG, load)


@dataclass(frozen=True)
class SendingSettings:
    """A project's settings the send path reads: sender identities, default layout, provider accounts by channel.

    Empty values mean the installation's (EMAIL_FROM, the providers of `<CHANNEL>_PROVIDERS`, no layout).
    """

    email_from: str = ""
    email_reply_to: str = ""
    sms_sender: str = ""
    default_layout: str = ""
    provider_accounts: dict[str, list[str]] = field(default_factory=dict)


NO_SETTINGS = SendingSettings()


def account_names(value: Any) -> list[str]:
    """Return the account names a project's `provider_accounts` gives one channel (a name or a list of names)."""
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list):
        return [name for name in value if isinstance(name, str) and name]
    return []


def sending_settings(environment_id: int | None) -> SendingSettings:
    """Return the sending settings of the project an environment belongs to (NO_SETTINGS for none).

    Part of the environment's cached settings (environment_settings): the send workers read them for every
    delivery, and a batch's reads share one look at the generation, so sending gains no query.
    """
    found = None if environment_id is None else environment_settings(environment_id)
    return NO_SETTINGS if found is None else found.sending


def _sending_settings_of(project: Project) -> SendingSettings:
    chosen = (project.provider_accounts or {}).items()
    accounts = {channel: names for channel, value in chosen if (names := account_names(value))}
    # Loaded once per process and generation: the place to say that an account the project names is gone or
    # serves another channel (the send path then retries those deliveries and sends the rest).
    for channel, names in accounts.items():
        for name in names:
            problem = provider_accounts.account_problem(name, channel)
            if problem:
                logger.warning("project '%s' sends its %s through %s", project.slug, channel, problem)
    return SendingSettings(
        email_from=project.email_from,
        email_reply_to=project.email_reply_to,
        sms_sender=project.sms_sender,
        default_layout=project.default_layout,
        provider_accounts=accounts,
    )


@dataclass(frozen=True)
class EnvironmentSettings:
    """What the accept and the API read of a key's environment and its project, on every request."""

    environment_id: int
    environment: str
    project_id: int
    slug: str
    name: str
    promotion: str
    # The project's rate over all of its keys ("1000/s"); empty: none.
    rate_limit: str
    # Daily limits per channel of this environment; a channel not named has none.
    quotas: Mapping[str, int]
    # The project's share of a queue among broadcasting projects (dispatch.shares), at least 1.
    weight: int
    # What the send path reads: sender identities, default layout, provider accounts.
    sending: SendingSettings


def environment_settings(environment_id: int) -> EnvironmentSettings | None:
    """Return the settings of an environment and its project, cached per process until either changes.

    The accept reads them on every request (quotas, the project's rate limit): from the per-process cache
    (core.config_cache; a save of a project or an environment invalidates every process's), never a query.
    """

    def load() -> EnvironmentSettings | None:
        found = Environment.objects.select_related("project").filter(pk=environment_id).first()
        if found is None:
            return None
        project = found.project
        return EnvironmentSettings(
            environment_id=found.pk,
            environment=found.name,
            project_id=project.pk,
            slug=project.slug,
            name=project.name,
            promotion=project.promotion,
            rate_limit=project.rate_limit,
            weight=max(1, int(project.weight or 1)),
            sending=_sending_settings_of(project),
            # Whole numbers only (the admin checks them, projects.quotas.quotas_validate); anything else is no limit.
            quotas=MappingProxyType(
                {str(k): v for k, v in dict(found.quotas or {}).items() if type(v) is int and v >= 0}
            ),
        )

    return cached("environment-settings", str(environment_id), load)


def environment_project_weight(environment_id: int | None) -> tuple[int, int]:
    """Return (project id, its weight) of an environment: its share of a queue among broadcasting projects.

    (0, 1) for no environment.
    """
    found = None if environment_id is None else environment_settings(environment_id)
    return (0, 1) if found is None else (found.project_id, found.weight)
