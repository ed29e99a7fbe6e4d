"""Write templates: create versions, publish them."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from audit.services import audit_record, diff
from core.chat import CHAT_PART
from core.errors import ApiError
from core.keys import key_errors
from projects.promotion import InUse, direct_change_check, promote
from templates_app.models import Layout, LayoutVersion, Template, TemplateVersion
from templates_app.rendering import (
    CHANNEL_PARTS,
    STRUCTURED_PARTS,
    RenderError,
    compile_part,
    normalize_locale,
    template_variables,
)
from templates_app.selectors import (
    LayoutNotFound,
    layout_exists,
    layout_get,
    layouts_in_use,
    template_exists,
    template_get,
    template_version_get,
    templates_in_use,
)

logger = logging.getLogger(__name__)

# BCP 47-like: a 2-3 letter language, then subtags (script, region, variant) joined by "-" or "_".
LOCALE_PATTERN = re.compile(r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*$")
MAX_LOCALE_LENGTH = 35
# A template string longer than this is a mistake (or an attack), not a message.
MAX_STRING_LENGTH = 100_000
# A channel needs at least one of these parts to produce a message.
REQUIRED_PARTS: dict[str, tuple[str, ...]] = {
    "email": ("subject",),
    "sms": ("text",),
    "inapp": ("body",),
    "webhook": ("body",),
}
# A chat message needs its text (every network's fallback), unless it is a WhatsApp template (content_sid).
ONE_OF_PARTS: dict[str, tuple[str, ...]] = {
    "email": ("text", "html"),
    "push": ("title", "body"),
    CHAT_PART: ("text", "content_sid"),
}
# The shape of the chat part's structured pieces: Block Kit is a list of blocks, the others objects.
_CHAT_SHAPES: dict[str, type] = {"blocks": list, "card": dict, "embed": dict, "variables": dict}


def canonical_locale(locale: str) -> str:
    """Return a locale in its canonical form: "pt_br" → "pt-BR", "zh_hant_tw" → "zh-Hant-TW"."""
    subtags = normalize_locale(locale).split("-")
    out = [subtags[0]]
    for subtag in subtags[1:]:
        if len(subtag) == 2 and subtag.isalpha():
            out.append(subtag.upper())
        elif len(subtag) == 4 and subtag.isalpha():
            out.append(subtag.title())
        else:
            out.append(subtag)
    return "-".join(out)


def _validate_structure(value: Any, path: str, errors: dict[str, list[str]], *, flat_strings: bool) -> None:
    """Check that a structured part is JSON whose strings compile (push data: a flat dict of strings)."""
    if flat_strings:
        if not isinstance(value, dict):
            errors[path] = ["must be an object of string values"]
            return
        for key, item in value.items():
            if not isinstance(item, str):
                errors[f"{path}.{key}"] = ["must be a string (push data values are strings)"]
        return
    if isinstance(value, str) and len(value) > MAX_STRING_LENGTH:
        errors[path] = [f"is longer than {MAX_STRING_LENGTH} characters"]
    elif isinstance(value, dict):
        for key, item in value.items():
            _validate_structure(item, f"{path}.{key}", errors, flat_strings=False)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _validate_structure(item, f"{path}[{i}]", errors, flat_strings=False)


class BudgetRefusal(ValidationError):
    """Content refused only because parts are over the template budget (the API answers `template_budget`)."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        super().__init__(fields)
        self.fields = fields


def validate_content(content: Any, *, default_locale: str) -> dict[str, Any]:
    """Return the content with canonical locale keys, or raise ValidationError naming each bad field.

    The shape is {locale: {channel: {part: template}}}: known channels and parts only, the default locale
    present, every template string compiling in the sandbox. When every reason is a part over the template
    budget, the error is a BudgetRefusal (a ValidationError), which the API answers as `template_budget`.
    """
    errors: dict[str, list[str]] = {}
    over_budget: set[str] = set()
    if not isinstance(content, dict) or not content:
        raise ValidationError({"content": ["must be a non-empty object of locales"]})
    canonical: dict[str, Any] = {}
    for locale, channels in content.items():
        path = f"content.{locale}"
        if not isinstance(locale, str) or len(locale) > MAX_LOCALE_LENGTH or not LOCALE_PATTERN.match(locale):
            errors[path] = ["is not a locale (such as 'en', 'pt-BR')"]
            continue
        key = canonical_locale(locale)
        if key in canonical:
            errors[path] = [f"duplicates locale '{key}'"]
            continue
        if not isinstance(channels, dict) or not channels:
            errors[path] = ["must be a non-empty object of channels"]
            continue
        for channel, parts in channels.items():
            channel_path = f"{path}.{channel}"
            if channel not in CHANNEL_PARTS or (channel not in settings.CHANNELS and channel != CHAT_PART):
                known = [c for c in settings.CHANNELS if c in CHANNEL_PARTS] + [CHAT_PART]
                errors[channel_path] = [f"unknown channel; known: {', '.join(known)}"]
                continue
            if not isinstance(parts, dict) or not parts:
                errors[channel_path] = ["must be a non-empty object of parts"]
                continue
            for part, value in parts.items():
                part_path = f"{channel_path}.{part}"
                if part not in CHANNEL_PARTS[channel]:
                    errors[part_path] = [f"unknown part; '{channel}' has: {', '.join(CHANNEL_PARTS[channel])}"]
                    continue
                if (channel, part) in STRUCTURED_PARTS:
                    shape = _CHAT_SHAPES.get(part) if channel == CHAT_PART else None
                    if shape is not None and not isinstance(value, shape):
                        errors[part_path] = ["must be a list" if shape is list else "must be an object"]
                        continue
                    before = len(errors)
                    flat = channel == "push" or (channel, part) == (CHAT_PART, "variables")
                    _validate_structure(value, part_path, errors, flat_strings=flat)
                    if len(errors) != before:
                        continue
                elif not isinstance(value, str):
                    errors[part_path] = ["must be a string"]
                    continue
                elif len(value) > MAX_STRING_LENGTH:
                    errors[part_path] = [f"is longer than {MAX_STRING_LENGTH} characters"]
                    continue
                try:
                    compile_part(channel, part, value, path=part_path)
                except RenderError as exc:
                    errors[exc.path or part_path] = [exc.message.removeprefix(f"{exc.path}: ")]
                    if exc.code == "template_budget":
                        over_budget.add(exc.path or part_path)
            for part in REQUIRED_PARTS.get(channel, ()):
                if part not in parts:
                    errors.setdefault(f"{channel_path}.{part}", ["is required"])
            one_of = ONE_OF_PARTS.get(channel)
            if one_of and not any(part in parts for part in one_of):
                errors.setdefault(channel_path, [f"needs at least one of: {', '.join(one_of)}"])
        canonical[key] = channels
    if not errors and canonical_locale(default_locale) not in canonical:
        errors["content"] = [f"must contain the default locale '{default_locale}'"]
    if errors and set(errors) <= over_budget:
        raise BudgetRefusal(errors)
    if errors:
        raise ValidationError(errors)
    return canonical


def _validate_header(*, key: str, category: str, default_locale: str) -> None:
    """Check the key, category and default locale of a template."""
    errors = key_errors(key)
    if category not in settings.NOTIFIER_CATEGORIES:
        errors["category"] = [f"unknown category; known: {', '.join(settings.NOTIFIER_CATEGORIES)}"]
    if (
        not isinstance(default_locale, str)
        or len(default_locale) > MAX_LOCALE_LENGTH
        or not LOCALE_PATTERN.match(default_locale)
    ):
        errors["default_locale"] = ["is not a locale (such as 'en', 'pt-BR')"]
    if errors:
        raise ValidationError(errors)


def _check_draft_keeps_header(*, template: Template, category: str, default_locale: str, publish: bool) -> None:
    """Refuse a draft that would change the category or default locale of a published template."""
    if publish or template.pk is None or template.published_version_id is None:
        return
    changed = {
        field: [f"can change only with publish=true (the published version uses '{current}')"]
        for field, current, new in (
            ("category", template.category, category),
            ("default_locale", template.default_locale, default_locale),
        )
        if current != new
    }
    if changed:
        raise ValidationError(changed)


def template_put_validate(
    *,
    key: str,
    category: str,
    default_locale: str,
    content: Any,
    publish: bool = True,
    template: Template | None = None,
) -> tuple[str, dict[str, Any]]:
    """Validate what template_put would write; return the canonical default locale and content.

    Raises ValidationError naming each bad field. `template`, when given, is the existing template (the
    admin validates its form with this before saving).
    """
    _validate_header(key=key, category=category, default_locale=default_locale)
    default_locale = canonical_locale(default_locale)
    canonical = validate_content(content, default_locale=default_locale)
    if template is not None:
        _check_draft_keeps_header(template=template, category=category, default_locale=default_locale, publish=publish)
    return default_locale, canonical


def template_put(
    *,
    key: str,
    category: str,
    default_locale: str,
    content: dict,
    publish: bool = True,
    actor: str = "",
    allowed_categories: list[str] | None = None,
    audit_actor: Any = None,
    client_id: int | None = None,
    layout: str = "",
    audit_action: str = "template.version_create",
    audit_changes: Mapping[str, Any] | None = None,
    enforce_promotion: bool = False,
) -> TemplateVersion:
    """Create a new version of a template (creating the template if new), published unless `publish` is false.

    Every call makes the next version number; concurrent calls are serialized on the template row. The
    template's category and default locale apply to its published version, so they change only when a
    version is published: a draft may not change them on a template that already has a published version.
    A non-empty `allowed_categories` (an API client's) restricts both the new and the existing category.
    With an `audit_actor` (API client or staff user) the new version is written to the audit log.
    `layout` names the email layout of the new version ("" for the category's default). `audit_action` and
    `audit_changes` (added to the entry's changes) name what made the version: a promotion, a rollback.

    `enforce_promotion`: the call is a direct change (an API key's PUT), refused with a 409 `promotion_required`
    in a live environment whose project changes live only by promotion from test.

    `client_id` is the calling API client's (None for staff and commands), recorded on a template it creates as
    who made it (`owner_client_id`). It grants nothing: within a project environment every key with the
    `templates` scope changes and publishes any of its templates (the scope narrows the lookup to that
    environment, so another project's or environment's template is never found here).
    """
    if enforce_promotion:
        direct_change_check(kind="template", key=key)
    layout = layout or ""
    if layout and not Layout.objects.filter(key=layout).exists():
        raise ValidationError({"layout": [f"unknown layout '{layout}'; create it with PUT /api/v1/layouts/{{key}}"]})
    if allowed_categories and category not in allowed_categories:
        raise ApiError(403, "category_forbidden", f"This API client may not use category '{category}'.")
    try:
        default_locale, canonical = template_put_validate(
            key=key, category=category, default_locale=default_locale, content=content
        )
    except BudgetRefusal as exc:
        path, reasons = next(iter(exc.fields.items()))
        raise ApiError(400, "template_budget", f"{path}: {reasons[0]}", fields=exc.fields) from None
    with transaction.atomic():
        template, created = Template.objects.get_or_create(
            key=key, defaults={"category": category, "default_locale": default_locale, "owner_client_id": client_id}
        )
        template = Template.objects.select_for_update().get(pk=template.pk)
        before = {"category": template.category, "published_version": template.published_version_id}
        if allowed_categories and template.category not in allowed_categories:
            raise ApiError(403, "category_forbidden", f"This API client may not use category '{template.category}'.")
        _check_draft_keeps_header(template=template, category=category, default_locale=default_locale, publish=publish)
        last = template.versions.aggregate(last=Max("version"))["last"] or 0
        version = TemplateVersion.objects.create(
            template=template, version=last + 1, content=canonical, created_by=actor[:255], layout=layout
        )
        if publish:
            _publish(template=template, version=version, category=category, default_locale=default_locale)
        else:
            template.save(update_fields=["updated_at"])
        if audit_actor is not None:
            changes = {
                "version": [None, version.version],
                "published": [None, publish],
                **({"owner_client_id": [None, client_id]} if created and client_id is not None else {}),
                **({"layout": [None, layout]} if layout else {}),
                **diff({} if created else {"category": before["category"]}, {"category": template.category}),
                **(audit_changes or {}),
            }
            audit_record(
                actor=audit_actor, action=audit_action, target_type="template", target_id=key, changes=changes
            )  # fmt: skip
    logger.info("template %s version %s created by %s (published=%s)", key, version.version, actor or "-", publish)
    version.template = template
    return version


def _publish(*, template: Template, version: TemplateVersion, category: str, default_locale: str) -> None:
    """Make `version` the published one of its (locked) template."""
    if version.published_at is None:
        version.published_at = timezone.now()
        version.save(update_fields=["published_at"])
    template.published_version = version
    template.category = category
    template.default_locale = default_locale
    template.save(update_fields=["published_version", "category", "default_locale", "updated_at"])


def template_version_publish(*, version: TemplateVersion, actor: str = "", audit_actor: Any = None) -> TemplateVersion:
    """Publish an existing version (a draft, or an older one to roll back to).

    Its content must contain the template's default locale, which the published version always serves.
    """
    with transaction.atomic():
        template = Template.objects.select_for_update().get(pk=version.template_id)
        version = TemplateVersion.objects.get(pk=version.pk)
        if canonical_locale(template.default_locale) not in {canonical_locale(k) for k in version.content}:
            raise ValidationError(
                {"version": [f"has no content for the template's default locale '{template.default_locale}'"]}
            )
        previous = template.published_version_id
        _publish(template=template, version=version, category=template.category, default_locale=template.default_locale)
        if audit_actor is not None:
            # pk=None (a first publish) matches no row, so `old` is None.
            old = TemplateVersion.objects.filter(pk=previous).values_list("version", flat=True).first()  # type: ignore[misc]
            audit_record(
                actor=audit_actor, action="template.publish", target_type="template", target_id=template.key,
                changes={"published_version": [old, version.version]},
            )  # fmt: skip
    logger.info("template %s version %s published by %s", template.key, version.version, actor or "-")
    version.template = template
    return version


def template_describe(*, template: Template, description: str) -> Template:
    """Set a template's description (free text for support staff; not part of any version)."""
    template.description = description
    template.save(update_fields=["description", "updated_at"])
    return template


def _validate_layout_part(value: Any, path: str, errors: dict[str, list[str]], *, html: bool) -> None:
    """Check one part of a layout: a string that compiles and places `{{ content }}`."""
    if not isinstance(value, str):
        errors[path] = ["must be a string"]
        return
    if len(value) > MAX_STRING_LENGTH:
        errors[path] = [f"is longer than {MAX_STRING_LENGTH} characters"]
        return
    try:
        compile_part("email", "html" if html else "text", value, path=path)
    except RenderError as exc:
        errors[path] = [exc.message.removeprefix(f"{exc.path}: ")]
        return
    if "content" not in template_variables({path: value}):
        errors[path] = ["must place the message with {{ content }}"]


def layout_put_validate(*, key: Any, html: Any, text: Any = "") -> None:
    """Check what layout_put would write; raise ValidationError naming each bad field."""
    errors = key_errors(key)
    _validate_layout_part(html, "html", errors, html=True)
    if text:
        _validate_layout_part(text, "text", errors, html=False)
    if errors:
        raise ValidationError(errors)


def layout_put(
    *,
    key: str,
    html: Any,
    text: Any = "",
    actor: str = "",
    audit_actor: Any = None,
    audit_action: str = "layout.version_create",
    audit_changes: Mapping[str, Any] | None = None,
    enforce_promotion: bool = False,
) -> LayoutVersion:
    """Create the next version of an email layout (creating the layout if new); the newest version is used.

    `html` (required) and `text` (optional) are template strings that place the message with `{{ content }}`;
    each is checked like a template part. With an `audit_actor` the new version is written to the audit log,
    as `audit_action` with `audit_changes` added. `enforce_promotion`: as template_put's.
    """
    if enforce_promotion:
        direct_change_check(kind="layout", key=key)
    layout_put_validate(key=key, html=html, text=text)
    with transaction.atomic():
        layout, created = Layout.objects.get_or_create(key=key)
        layout = Layout.objects.select_for_update().get(pk=layout.pk)
        last = layout.versions.aggregate(last=Max("version"))["last"] or 0
        version = LayoutVersion.objects.create(
            layout=layout, version=last + 1, html=html, text=text or "", created_by=actor[:255]
        )
        layout.save(update_fields=["updated_at"])
        if audit_actor is not None:
            changes = {"version": [last or None, version.version], "created": [None, created], **(audit_changes or {})}
            audit_record(actor=audit_actor, action=audit_action, target_type="layout", target_id=key, changes=changes)
    logger.info("layout %s version %s created by %s", key, version.version, actor or "-")
    version.layout = layout
    return version


# --- promotion from test to live, and rollback -----------------------------------------------------------------


def template_promote(
    *,
    key: str,
    environment_id: int,
    actor: str = "",
    audit_actor: Any = None,
    client_id: int | None = None,
    allowed_categories: list[str] | None = None,
) -> TemplateVersion:
    """Publish the test environment's published version of a template as live's next version; return it.

    `environment_id` is the caller's (either environment of the project). The live template is changed as by
    template_put with the same `client_id` and `allowed_categories`; a layout the version names must exist in
    live.
    Raises ApiError 404 (no such template in test) or 400 (`nothing_to_promote`, or what template_put refuses).
    """

    def write(test: InUse) -> TemplateVersion:
        return template_put(
            key=key,
            category=test.content["category"],
            default_locale=test.content["default_locale"],
            content=test.content["content"],
            layout=test.content["layout"],
            publish=True,
            actor=actor,
            allowed_categories=allowed_categories,
            audit_actor=audit_actor,
            client_id=client_id,
            audit_action="template.promote",
            audit_changes={"test_version": [None, test.version]},
        )

    return promote(
        kind="template", key=key, environment_id=environment_id, read=templates_in_use, exists=template_exists,
        write=write,
    )  # fmt: skip


def template_rollback(
    *,
    key: str,
    version: int,
    actor: str = "",
    audit_actor: Any = None,
    client_id: int | None = None,
    allowed_categories: list[str] | None = None,
) -> TemplateVersion:
    """Publish an earlier version of a template again as its next version (in the scope's environment).

    The new version has the earlier one's content and layout, with the template's current category and default
    locale; it is written as by template_put (categories, validation). Raises TemplateNotFound for an
    unknown key or version, ApiError 400 `already_published` when that version is the published one.
    """
    template = template_get(key=key)
    earlier = template_version_get(key=key, version=version)
    if earlier.pk == template.published_version_id:
        raise ApiError(
            400,
            "already_published",
            f"Version {version} of template '{key}' is its published version already.",
            {"version": ["is the published version already"]},
        )
    return template_put(
        key=key,
        category=template.category,
        default_locale=template.default_locale,
        content=earlier.content,
        layout=earlier.layout,
        publish=True,
        actor=actor,
        allowed_categories=allowed_categories,
        audit_actor=audit_actor,
        client_id=client_id,
        audit_action="template.rollback",
        audit_changes={"rolled_back_to": [None, version]},
    )


def layout_promote(*, key: str, environment_id: int, actor: str = "", audit_actor: Any = None) -> LayoutVersion:
    """Write the test environment's newest version of a layout as live's next version; return it.

    Raises ApiError 404 (no such layout in test) or 400 (`nothing_to_promote`, or what layout_put refuses).
    """

    def write(test: InUse) -> LayoutVersion:
        return layout_put(
            key=key,
            html=test.content["html"],
            text=test.content["text"],
            actor=actor,
            audit_actor=audit_actor,
            audit_action="layout.promote",
            audit_changes={"test_version": [None, test.version]},
        )

    return promote(
        kind="layout", key=key, environment_id=environment_id, read=layouts_in_use, exists=layout_exists, write=write
    )


def layout_rollback(*, key: str, version: int, actor: str = "", audit_actor: Any = None) -> LayoutVersion:
    """Make an earlier version of a layout the newest again, as its next version (in the scope's environment).

    Raises LayoutNotFound for an unknown key or version, ApiError 400 `already_current` for the newest version.
    """
    _, versions = layout_get(key=key)
    earlier = next((v for v in versions if v.version == version), None)
    if earlier is None:
        raise LayoutNotFound(f"layout '{key}' has no version {version}")
    if earlier.version == versions[0].version:
        raise ApiError(
            400,
            "already_current",
            f"Version {version} of layout '{key}' is its newest version, the one in use.",
            {"version": ["is the version in use already"]},
        )
    return layout_put(
        key=key,
        html=earlier.html,
        text=earlier.text,
        actor=actor,
        audit_actor=audit_actor,
        audit_action="layout.rollback",
        audit_changes={"rolled_back_to": [None, version]},
    )
