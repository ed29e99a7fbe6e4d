"""Read templates and their versions."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import QuerySet

from core import config_cache
from projects.promotion import InUse
from projects.scoping import owner_scope
from templates_app.models import Layout, LayoutVersion, Template, TemplateVersion


class TemplateNotFound(Exception):
    """No template, version or published version matches a spec."""


def parse_spec(spec: str) -> tuple[str, int | None]:
    """Split "key" or "key@3" into the key and the pinned version number (None when not pinned)."""
    key, sep, number = (spec or "").strip().partition("@")
    if not key:
        raise TemplateNotFound("template key is empty")
    if not sep:
        return key, None
    if not number.isdigit() or int(number) < 1:
        raise TemplateNotFound(f"template '{spec}': the version after '@' must be a positive integer")
    return key, int(number)


def template_version_resolve(spec: str) -> TemplateVersion:
    """Return the version a send uses: "key" → the published version, "key@3" → version 3 if published.

    Raises TemplateNotFound for an unknown key or version, or when nothing (or not that version) was ever
    published. The returned version has its template loaded.
    """
    key, number = parse_spec(spec)
    if number is None:
        template = Template.objects.select_related("published_version").filter(key=key).first()
        if template is None:
            raise TemplateNotFound(f"unknown template '{key}'")
        version = template.published_version
        if version is None:
            raise TemplateNotFound(f"template '{key}' has no published version")
        version.template = template
        return version
    version = TemplateVersion.objects.select_related("template").filter(template__key=key, version=number).first()
    if version is None:
        if not Template.objects.filter(key=key).exists():
            raise TemplateNotFound(f"unknown template '{key}'")
        raise TemplateNotFound(f"template '{key}' has no version {number}")
    if version.published_at is None:
        raise TemplateNotFound(f"template '{key}' version {number} is a draft that was never published")
    return version


_exact_versions: dict[tuple[int, str, int], TemplateVersion] = {}
_EXACT_VERSIONS_MAX = 4096
config_cache.forget_all_also(_exact_versions.clear)


def template_version_exact(*, environment_id: int, key: str, version: int | None) -> TemplateVersion | None:
    """Return version `version` of an environment's template `key` (drafts too), or None; cached per process.

    What a notification was accepted with, read again by the send workers, the fan-out's stored in-app items and
    the support console: versions are immutable, so the cache never goes stale. The environment is part of the
    key: two projects' templates may share a key and a version number.
    """
    cache_key = (environment_id, key, version or 0)
    found = _exact_versions.get(cache_key)
    if found is None:
        with owner_scope(environment_id):
            # No pinned version (None) matches no row, as 0 does.
            found = (
                TemplateVersion.objects.select_related("template")
                .filter(template__key=key, version=version or 0)
                .first()
            )
        if found is None:
            return None
        if len(_exact_versions) > _EXACT_VERSIONS_MAX:
            _exact_versions.clear()
        _exact_versions[cache_key] = found
    return found


def template_list(*, after_id: int = 0, limit: int = 50) -> list[Template]:
    """Return up to `limit` templates with id > `after_id` in id order, with their published version (keyset page)."""
    qs = Template.objects.select_related("published_version").filter(pk__gt=after_id).order_by("pk")
    return list(qs[:limit])


def template_get(*, key: str) -> Template:
    """Return the template with `key` and its published version, or raise TemplateNotFound."""
    template = Template.objects.select_related("published_version").filter(key=key).first()
    if template is None:
        raise TemplateNotFound(f"unknown template '{key}'")
    return template


def template_version_get(*, key: str, version: int | None = None) -> TemplateVersion:
    """Return a version of a template, drafts included; without `version`, the published one or else the latest."""
    if version is not None:
        found = TemplateVersion.objects.select_related("template").filter(template__key=key, version=version).first()
        if found is None:
            template_get(key=key)
            raise TemplateNotFound(f"template '{key}' has no version {version}")
        return found
    template = template_get(key=key)
    found = template.published_version or template.versions.order_by("-version").first()
    if found is None:
        raise TemplateNotFound(f"template '{key}' has no versions")
    found.template = template
    return found


def template_version_list(*, template: Template) -> QuerySet[TemplateVersion]:
    """Return the versions of a template, newest first."""
    return TemplateVersion.objects.filter(template=template).order_by("-version")


def template_default_locale(*, key: str, fallback: str = "en") -> str:
    """Return the default locale of the template with `key`, or `fallback` for a new template."""
    return Template.objects.filter(key=key).values_list("default_locale", flat=True).first() or fallback


class LayoutNotFound(Exception):
    """No email layout has the key asked for."""


def layout_get(*, key: str) -> tuple[Layout, list[LayoutVersion]]:
    """Return the layout with `key` and its versions, newest first, or raise LayoutNotFound."""
    layout = Layout.objects.filter(key=key).first()
    if layout is None:
        raise LayoutNotFound(f"unknown layout '{key}'")
    versions = list(layout.versions.order_by("-version"))
    for version in versions:
        version.layout = layout
    return layout, versions


def templates_in_use(keys: Sequence[str] | None = None) -> dict[str, InUse]:
    """Return, by key, the published version of the scope's templates (all, or those of `keys`) and what it sends.

    What a send uses is the published version's content and layout with the template's category and default
    locale (they change with a publish), so those four are what promotion compares; a template with only
    drafts is left out.
    """
    templates = Template.objects.filter(published_version__isnull=False).select_related("published_version")
    if keys is not None:
        templates = templates.filter(key__in=keys)
    found: dict[str, InUse] = {}
    for template in templates:
        version = template.published_version
        assert version is not None  # filtered on
        content = {
            "category": template.category,
            "default_locale": template.default_locale,
            "layout": version.layout,
            "content": version.content,
        }
        found[template.key] = InUse(version=version.version, content=content)
    return found


def template_exists(key: str) -> bool:
    """Say whether the scope's environment has a template `key` (published or not)."""
    return Template.objects.filter(key=key).exists()


def layouts_in_use(keys: Sequence[str] | None = None) -> dict[str, InUse]:
    """Return, by key, the newest version of the scope's layouts (all, or those of `keys`): the one emails use."""
    versions = LayoutVersion.objects.select_related("layout").order_by("layout_id", "-version").distinct("layout_id")
    if keys is not None:
        versions = versions.filter(layout__key__in=keys)
    return {v.layout.key: InUse(version=v.version, content={"html": v.html, "text": v.text}) for v in versions}


def layout_exists(key: str) -> bool:
    """Say whether the scope's environment has a layout `key`."""
    return Layout.objects.filter(key=key).exists()


def template_version_cached(spec: str, *, environment_id: int) -> TemplateVersion:
    """Return the published (or pinned, "key@N") version a spec resolves to in an environment, cached per process.

    Cached by core.config_cache under the owner and the spec. Raises like template_version_resolve when there is
    none; not-found answers are never cached.
    """

    def resolve() -> TemplateVersion:
        with owner_scope(environment_id):
            return template_version_resolve(spec)

    value = config_cache.cached("template", f"{environment_id}:{spec}", resolve)
    assert value is not None  # template_version_resolve raises instead of returning None
    return value
