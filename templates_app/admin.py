"""Admin for support staff: edit templates as forms (each save makes a new immutable version), preview, diff, publish.

The editor shows one block of fields per (locale, channel) (templates_app/admin_editor.py); saving works with
plain form posts, and a small dependency-free script (static/templates_app/editor.js) adds the live SMS
counter and the preview beside the form. Publishing (or rolling back to an older version) takes the
`templates_app.publish_template` permission and a confirmation page; every write is audited.
"""

from __future__ import annotations

import json
from typing import Any, cast

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST
from rest_framework.exceptions import ValidationError

from audit.services import audit_record
from core.categories import is_optional
from projects.admin import OwnedAdmin, PromotionAdmin, member_project_ids, version_rollback_link
from projects.models import Environment
from projects.promotion import Reader
from projects.scoping import owner_id, owner_scope
from projects.selectors import environment_id_of
from templates_app import admin_editor as editor
from templates_app.layouts import render_all
from templates_app.models import Layout, LayoutVersion, Template, TemplateVersion
from templates_app.rendering import CHANNEL_PARTS, STRUCTURED_PARTS, RenderError, template_variables
from templates_app.selectors import layouts_in_use, templates_in_use
from templates_app.services import (
    LOCALE_PATTERN,
    canonical_locale,
    layout_promote,
    layout_put,
    layout_put_validate,
    layout_rollback,
    template_describe,
    template_promote,
    template_put,
    template_put_validate,
    template_version_publish,
    validate_content,
)
from templates_app.sms import sms_info, sms_preview

HEADER_FIELDS = ("key", "category", "default_locale")
PUBLISH_PERMISSION = "templates_app.publish_template"
OPTIONAL_ONLY_PERMISSION = "templates_app.edit_optional_templates_only"
# An environment id no row has (ids start at 1): a scope in which nothing of any project is found.
NO_ENVIRONMENT = 0


def _pretty(value: Any) -> str:
    """Format JSON for reading and editing."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def _version_status(version: TemplateVersion) -> str:
    """Say whether a version is the published one, was published before, or is a draft."""
    if version.pk == version.template.published_version_id:
        return "published"
    return "previously published" if version.published_at else "draft"


def _error_lines(detail: Any) -> dict[str, list[str]]:
    """Flatten a DRF ValidationError detail into {field path: [messages]}."""
    if isinstance(detail, dict):
        return {
            str(key): [str(m) for m in (value if isinstance(value, list) else [value])] for key, value in detail.items()
        }
    return {"content": [str(m) for m in (detail if isinstance(detail, list) else [detail])]}


def _content_errors_by_field(detail: Any, field_names: set[str]) -> dict[str | None, list[str]]:
    """Map validation paths to the editor's field names (None: the form as a whole)."""
    out: dict[str | None, list[str]] = {}
    for path_, reasons in _error_lines(detail).items():
        if path_ in HEADER_FIELDS:
            out.setdefault(path_, []).extend(reasons)
            continue
        target = editor.content_path_to_field(path_)
        if target is None:
            # A channel-level message ("needs at least one of ...") goes beside the block's first field.
            pieces = path_.split(".")
            if len(pieces) == 3 and pieces[2] in CHANNEL_PARTS:
                target = editor.field_name(pieces[1], pieces[2], CHANNEL_PARTS[pieces[2]][0])
        if target in field_names:
            out.setdefault(target, []).extend(reasons)
        else:
            out.setdefault(None, []).extend(f"{path_}: {reason}" for reason in reasons)
    return out


class TemplateForm(forms.ModelForm):
    """The template's header plus, block by block, the content of the version that saving creates."""

    category = forms.ChoiceField(choices=())
    publish = forms.BooleanField(
        required=False,
        initial=False,
        help_text="Publish the new version at once (otherwise it is saved as a draft to preview and publish later).",
    )
    add_locale = forms.CharField(
        required=False, max_length=35, help_text="Add a block: a locale (such as 'de', 'pt-BR') …"
    )
    add_channel = forms.ChoiceField(required=False, choices=(), help_text="… and a channel, then save.")
    layout = forms.ChoiceField(
        required=False,
        choices=(),
        help_text="The email layout the HTML is placed in (none: the category's default layout, if it has one).",
    )

    # Set by TemplateAdmin.get_form for the user: the projects whose templates they may add (their layouts are
    # offered before an environment is chosen; None: all), and those where they edit optional categories only.
    layout_projects: list[int] | None = None
    optional_only_projects: list[int] = []

    class Meta:
        model = Template
        fields = ("environment", "key", "category", "default_locale", "description")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["category"]).choices = [(c, c) for c in settings.NOTIFIER_CATEGORIES]
        cast(forms.ChoiceField, self.fields["add_channel"]).choices = [
            ("", "—"),
            *((c, c) for c in editor.known_channels()),
        ]
        # The layouts of the template's environment (a layout is named by key within it).
        layouts = Layout.objects.order_by("key")
        if self.instance.pk:
            layouts = layouts.filter(environment_id=self.instance.environment_id)
        elif self.layout_projects is not None:
            layouts = layouts.filter(environment__project_id__in=self.layout_projects)
        cast(forms.ChoiceField, self.fields["layout"]).choices = [
            ("", "—"),
            *((key, key) for key in dict.fromkeys(layouts.values_list("key", flat=True))),
        ]
        self.latest_content: dict[str, Any] | None = None
        self.latest_layout = ""
        if self.instance.pk:
            self.fields["key"].disabled = True
            latest = self.instance.versions.order_by("-version").only("content", "layout").first()
            if latest is not None:
                self.latest_content = latest.content
                self.latest_layout = latest.layout
                self.fields["layout"].initial = latest.layout
        self.creates_version = False
        self.canonical_content: dict[str, Any] = {}
        self.added_block: tuple[str, str] | None = None
        self.blocks = self._blocks()
        for locale, channel in self.blocks:
            for part in CHANNEL_PARTS[channel]:
                self.fields[editor.field_name(locale, channel, part)] = self._part_field(locale, channel, part)

    def _blocks(self) -> list[tuple[str, str]]:
        """Return the blocks to show: those posted (the editor may have added some), else the latest version's."""
        base = editor.blocks_of(self.latest_content) if self.latest_content else [("en", "email")]
        # The default locale's blocks first: the others translate it.
        default = self.instance.default_locale if self.instance.pk else "en"
        base.sort(key=lambda block: block[0] != default)
        if not self.is_bound:
            return base
        blocks = editor.posted_blocks(self.data) or base
        locale = str(self.data.get("add_locale") or "").strip()
        channel = str(self.data.get("add_channel") or "")
        if locale and channel in CHANNEL_PARTS and LOCALE_PATTERN.match(locale):
            block = (canonical_locale(locale), channel)
            if block not in blocks:
                blocks.append(block)
                self.added_block = block
        return blocks

    def _part_field(self, locale: str, channel: str, part: str) -> forms.CharField:
        """Build the field of one part, prefilled from the latest version."""
        value = ((self.latest_content or {}).get(locale) or {}).get(channel, {}).get(part)
        structured = (channel, part) in STRUCTURED_PARTS
        if (channel, part) in editor.ONE_LINE_PARTS:
            widget: forms.Widget = forms.TextInput(attrs={"class": "vLargeTextField tpl-part", "size": 80})
        else:
            rows = 10 if (channel, part) == ("email", "html") or structured else 4
            attrs = {"rows": rows, "cols": 80, "class": "tpl-part" + (" tpl-json" if structured else "")}
            if channel == "sms":
                attrs["data-sms"] = "1"
            widget = forms.Textarea(attrs=attrs)
        return forms.CharField(
            required=False,
            label=part,
            widget=widget,
            initial=editor.part_to_text(channel, part, value) if value is not None else "",
            strip=False,
        )

    def _check_in_environment(self, environment: Any, data: dict[str, Any]) -> None:
        """Check what depends on the template's project environment: its layout, and the user's categories there."""
        category = data.get("category")
        if environment.project_id in self.optional_only_projects and category and not is_optional(category):
            self.add_error("category", f"In {environment.project} you may edit templates of optional categories only.")
        layout = data.get("layout") or ""
        if layout and not Layout.objects.filter(environment=environment, key=layout).exists():
            self.add_error("layout", f"No layout '{layout}' in {environment}.")

    def editor_blocks(self) -> list[dict[str, Any]]:
        """Return the blocks with their bound fields, for the change form's template."""
        out = []
        for locale, channel in self.blocks:
            fields = [self[editor.field_name(locale, channel, part)] for part in CHANNEL_PARTS[channel]]
            block: dict[str, Any] = {
                "locale": locale,
                "channel": channel,
                "fields": fields,
                "remove_name": editor.remove_name(locale, channel),
                "removed": self.is_bound and bool(self.data.get(editor.remove_name(locale, channel))),
                "added": (locale, channel) == self.added_block,
            }
            if channel == "sms":
                info = sms_info(str(fields[0].value() or ""))
                block["sms"] = info
            out.append(block)
        return out

    def clean(self) -> dict[str, Any]:
        """Read the blocks and validate the new version exactly as template_put will, errors beside fields."""
        data = cast(dict[str, Any], super().clean())  # ModelForm.clean returns cleaned_data, never None
        environment = self.instance.environment if self.instance.pk else data.get("environment")
        if environment is not None:
            self._check_in_environment(environment, data)
        posted_any = self.is_bound and bool(editor.posted_blocks(self.data))
        if not posted_any and self.latest_content is not None:
            content: dict[str, Any] | None = self.latest_content
        else:
            parsed = editor.content_from_data(self.data, self.blocks)
            for name, reasons in parsed.errors.items():
                for reason in reasons:
                    self.add_error(name, reason)
            content = parsed.content
            if not content:
                self.add_error(None, "A template needs at least one block (a locale and a channel).")
        if self.added_block is not None:
            locale, channel = self.added_block
            # Saving stops here so the new block can be filled in; validation below still says what it lacks.
            self.add_error(None, f"Block {locale} · {channel} added: fill it in, then save.")
        if content is None or any(name != "__all__" for name in self.errors):
            return data
        header_changed = self.instance.pk and any(
            field in self.changed_data for field in ("category", "default_locale")
        )
        header_changed = header_changed or (data.get("layout") or "") != self.latest_layout
        self.creates_version = not self.instance.pk or content != self.latest_content or bool(header_changed)
        if not self.creates_version:
            return data
        field_names = set(self.fields)
        try:
            _, self.canonical_content = template_put_validate(
                key=data.get("key") or self.instance.key,
                category=data.get("category", ""),
                default_locale=data.get("default_locale", ""),
                content=content,
                publish=bool(data.get("publish")),
                template=self.instance if self.instance.pk else None,
            )
        except ValidationError as exc:
            for target, reasons in _content_errors_by_field(exc.detail, field_names).items():
                for reason in reasons:
                    self.add_error(target, reason)
            return data
        for target, reasons in editor.unknown_variable_errors(content, data.get("default_locale", "")).items():
            for reason in reasons:
                self.add_error(target if target in field_names else None, reason)
        return data


class TemplateVersionInline(admin.TabularInline):
    """The versions of a template, newest first; read-only because versions are immutable."""

    model = TemplateVersion
    fields = ("version", "status", "created_by", "created_at", "published_at", "channels_list", "links")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ("-version",)
    verbose_name_plural = "Versions (immutable; publish or roll back from here)"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[TemplateVersion]:
        return super().get_queryset(request).select_related("template")

    @admin.display(description="status")
    def status(self, obj: TemplateVersion) -> str:
        return _version_status(obj)

    @admin.display(description="channels")
    def channels_list(self, obj: TemplateVersion) -> str:
        return ", ".join(obj.channels)

    @admin.display(description="content")
    def content_json(self, obj: TemplateVersion) -> str:
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', _pretty(obj.content))

    @admin.display(description="")
    def links(self, obj: TemplateVersion) -> str:
        return _version_links(obj, can_publish=True)

    @admin.display(description="")
    def view_links(self, obj: TemplateVersion) -> str:
        return _version_links(obj, can_publish=False)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:  # type: ignore[override]  # a list[str] is one of django-stubs' list | tuple shapes, but list is invariant
        """Offer publish and roll-back links only to those allowed to publish (in the template's project)."""
        return _with_links(list(self.fields), request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return _with_links(list(self.readonly_fields), request, obj)


def _with_links(fields: list[str], request: HttpRequest, obj: Any = None) -> list[str]:
    """Swap the links column for its view-only twin when the user may not publish (`obj`'s, or in any project)."""
    if request.user.has_perm(PUBLISH_PERMISSION, obj):
        return fields
    return ["view_links" if name == "links" else name for name in fields]


def optional_only_projects(request: HttpRequest) -> list[int]:
    """Return the projects where the user edits templates of optional categories only (their role there)."""
    # Superusers hold every permission, this narrowing one too: it does not apply to them.
    return [] if request.user.is_superuser else member_project_ids(request.user, OPTIONAL_ONLY_PERMISSION) or []


def _optional_categories() -> list[str]:
    return [c for c in settings.NOTIFIER_CATEGORIES if is_optional(c)]


def _without_closed_categories(queryset: QuerySet[Any], request: HttpRequest, lookup: str) -> QuerySet[Any]:
    """Leave out the templates (by `lookup`, the path to the template) the user's role keeps them from.

    Where a member edits optional categories only (Marketing), the other templates of that project are not
    theirs to see; elsewhere all are.
    """
    restricted = optional_only_projects(request)
    if not restricted:
        return queryset
    closed = Q(**{f"{lookup}environment__project_id__in": restricted}) & ~Q(
        **{f"{lookup}category__in": _optional_categories()}
    )
    return queryset.exclude(closed)


def _is_current(version: TemplateVersion) -> bool:
    """Say whether `version` is its template's published version."""
    return version.pk == version.template.published_version_id


def _version_links(version: TemplateVersion, *, can_publish: bool) -> str:
    """Links of one version: preview, diff against the published one, publish or roll back (confirmed)."""
    if version.pk is None:  # the inline's blank form
        return ""
    links = [("Preview", reverse("admin:templates_app_templateversion_preview", args=[version.pk]))]
    published = version.template.published_version
    if published is not None and published.pk != version.pk:
        diff_url = reverse("admin:templates_app_template_diff", args=[version.template_id])
        links.append(("Diff", f"{diff_url}?a={published.version}&b={version.version}"))
    if can_publish and not _is_current(version):
        older = published is not None and version.version < published.version
        links.append(
            (
                "Roll back to this" if older else "Publish",
                reverse("admin:templates_app_templateversion_publish", args=[version.pk]),
            )
        )
    return format_html_join(" · ", '<a href="{1}">{0}</a>', links)


@admin.register(Template)
class TemplateAdmin(PromotionAdmin):
    """Templates: saving new content creates a new version through template_put (published if asked and allowed).

    A template of a test environment is promoted to live from its page ("Promote to live", with the diff first);
    rolling back is publishing an earlier version again (the versions' links), which takes the publish permission.
    """

    form = TemplateForm
    change_form_template = "admin/templates_app/template/change_form.html"
    list_display = ("key", "category", "default_locale", "published", "updated_at")
    list_filter = ("category",)
    search_fields = ("key", "description")
    list_select_related = ("published_version",)
    readonly_fields = ("published_version", "owner", "promotion", "created_at", "updated_at")
    inlines = [TemplateVersionInline]
    promotion_kind = "template"
    rollback_here = False

    def promotion_reader(self) -> Reader:
        return templates_in_use

    def promotion_allowed(self, request: HttpRequest, obj: Any) -> bool:
        """Promoting publishes a version in live: it takes the publish permission."""
        return bool(request.user.has_perm(PUBLISH_PERMISSION))

    def promotion_run(self, request: HttpRequest, obj: Template) -> int:
        version = template_promote(
            key=obj.key,
            environment_id=owner_id(obj),
            actor=f"admin:{request.user.get_username()}",
            audit_actor=request.user,
        )
        return version.version

    @admin.display(description="made by")
    def owner(self, obj: Template) -> str:
        """Say who made it: an API client over the API, or staff; every key of its environment may change it."""
        if obj.pk is None or obj.owner_client_id is None:
            return "staff (in the admin or by a command)"
        return f"API client #{obj.owner_client_id} (over the API)"

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:  # type: ignore[override]  # a list[str] is one of django-stubs' list | tuple shapes, but list is invariant
        """Show the publish box only to those allowed to publish (in the template's project, if it exists)."""
        fields = [
            "environment", "key", "category", "default_locale", "layout", "description", "published_version", "owner"
        ]  # fmt: skip
        if request.user.has_perm(PUBLISH_PERMISSION, obj):
            fields.extend(["publish", "promotion"] if obj is not None else ["publish"])
        return [*fields, "add_locale", "add_channel", "created_at", "updated_at"]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """Tell the form the user's projects; offer one who may edit only some categories just those."""
        form = super().get_form(request, obj, change=change, **kwargs)
        restricted = optional_only_projects(request)
        addable = self.projects_where(request, "add")
        # Only some categories where the template is (or, for a new one, wherever the user may add templates);
        # a new template's environment is checked against the user's role there when the form is cleaned.
        narrow = request.user.has_perm(OPTIONAL_ONLY_PERMISSION, obj) if obj is not None else bool(restricted)
        if obj is None and addable is not None:
            narrow = narrow and set(addable) <= set(restricted)
        categories = _optional_categories() if narrow and not request.user.is_superuser else None

        # `form` is the class get_form built at run time: mypy sees a variable, not a class.
        class ProjectTemplateForm(form):  # type: ignore[misc, valid-type]
            layout_projects = addable
            optional_only_projects = restricted

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                if categories is not None:
                    cast(forms.ChoiceField, self.fields["category"]).choices = [(c, c) for c in categories]

        return ProjectTemplateForm

    def get_queryset(self, request: HttpRequest) -> QuerySet[Template]:
        """Limit a member who may edit only some categories in a project (the Marketing role) to those there."""
        return _without_closed_categories(super().get_queryset(request), request, "")

    @admin.display(description="published version", ordering="published_version__version")
    def published(self, obj: Template) -> str:
        return f"v{obj.published_version.version}" if obj.published_version else "—"

    def save_model(self, request: HttpRequest, obj: Template, form: TemplateForm, change: bool) -> None:
        """Write through the services, in the template's environment: a new version, else the description."""
        with self.owned(request, obj, change=change):
            self._save(request, obj, form, change)

    def _save(self, request: HttpRequest, obj: Template, form: TemplateForm, change: bool) -> None:
        if request.user.has_perm(OPTIONAL_ONLY_PERMISSION, obj) and not request.user.is_superuser:
            if not is_optional(form.cleaned_data["category"]):
                raise PermissionDenied
        if form.creates_version:
            publish = bool(form.cleaned_data.get("publish")) and request.user.has_perm(PUBLISH_PERMISSION, obj)
            before = obj.published_version.version if change and obj.published_version else None
            # In the template's own environment: the admin runs outside any scope, and other environments have
            # templates of the same key.
            with owner_scope(owner_id(obj)):
                version = template_put(
                    key=obj.key,
                    category=form.cleaned_data["category"],
                    default_locale=form.cleaned_data["default_locale"],
                    content=form.canonical_content,
                    publish=publish,
                    actor=f"admin:{request.user.get_username()}",
                    audit_actor=request.user,
                    layout=form.cleaned_data.get("layout") or "",
                )
            obj.pk = version.template.pk
            obj.refresh_from_db()
            # template_put audits the new version; publishing it at once is recorded as a publish too.
            if publish:
                audit_record(
                    actor=request.user,
                    action="template.publish",
                    target_type="template",
                    target_id=obj.key,
                    changes={"published_version": [before, version.version]},
                )
            state = "published" if version.published_at else "saved as a draft"
            messages.info(request, f"Version {version.version} of '{obj.key}' {state}.")
        if "description" in form.changed_data:
            template_describe(template=obj, description=form.cleaned_data["description"])
            audit_record(actor=request.user, action="template.describe", target_type="template", target_id=obj.key)

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "preview-draft/",
                self.admin_site.admin_view(require_POST(self.preview_draft_view)),
                name="templates_app_template_preview_draft",
            ),
            path(
                "<path:object_id>/diff/", self.admin_site.admin_view(self.diff_view), name="templates_app_template_diff"
            ),
        ]
        return own + super().get_urls()

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """Add what the editor's template needs: the preview's URL, a sample payload, the locales."""
        form = context["adminform"].form
        content = form.latest_content or {}
        preview_url = reverse("admin:templates_app_template_preview_draft")
        if form.instance.pk:
            # The preview renders in the template's environment (its layouts); a new one's comes with the form.
            preview_url += f"?template={form.instance.pk}"
        context.update(
            {
                "preview_url": preview_url,
                "sample_payload": _pretty({name: f"[{name}]" for name in template_variables(content)}),
                "editor_locales": list(dict.fromkeys(locale for locale, _ in form.blocks)),
            }
        )
        return super().render_change_form(request, context, *args, **kwargs)

    def preview_draft_view(self, request: HttpRequest) -> JsonResponse:
        """Render the form's unsaved content with a sample payload; errors come back by field name."""
        if not (self.has_view_permission(request) or self.has_add_permission(request)):
            raise PermissionDenied
        environment_id = self._preview_environment(request)
        with owner_scope(environment_id):
            return self._preview_draft(request)

    def _preview_environment(self, request: HttpRequest) -> int | None:
        """Return the environment a draft previews in: its template's, or the one chosen in a new one's form."""
        template_id = str(request.GET.get("template") or "")
        if template_id.isdigit():
            template = get_object_or_404(self.get_queryset(request), pk=template_id)
            return environment_id_of(template)
        posted = str(request.POST.get("environment") or "")
        projects = self.projects_where(request, "add")
        environments = Environment.objects.filter(pk=posted) if posted.isdigit() else Environment.objects.none()
        if projects is not None:
            environments = environments.filter(project_id__in=projects)
        found = environments.values_list("id", flat=True).first()
        # A member who has not chosen an environment yet previews in none of them: no layout is found.
        return found if found is not None else (None if projects is None else NO_ENVIRONMENT)

    def _preview_draft(self, request: HttpRequest) -> JsonResponse:
        default_locale = str(request.POST.get("default_locale") or "en")
        try:
            payload = json.loads(request.POST.get("preview_payload") or "{}")
        except json.JSONDecodeError as exc:
            return JsonResponse({"errors": {"preview_payload": [f"Not valid JSON: {exc}"]}, "channels": []})
        if not isinstance(payload, dict):
            return JsonResponse({"errors": {"preview_payload": ["The payload must be a JSON object."]}, "channels": []})
        blocks = editor.posted_blocks(request.POST)
        parsed = editor.content_from_data(request.POST, blocks)
        field_names = {editor.field_name(loc, ch, part) for loc, ch in blocks for part in CHANNEL_PARTS[ch]}
        errors: dict[str, list[str]] = dict(parsed.errors)
        if not errors:
            try:
                validate_content(parsed.content, default_locale=default_locale)
            except ValidationError as exc:
                for target, reasons in _content_errors_by_field(exc.detail, field_names).items():
                    errors.setdefault(target or "__all__", []).extend(reasons)
            errors.update(editor.unknown_variable_errors(parsed.content, default_locale))
        channels: list[dict[str, Any]] = []
        if not errors:
            # The form's category and layout too: the preview shows the email inside the layout it would get.
            category = str(request.POST.get("category") or "")
            template = Template(key="preview", category=category, default_locale=default_locale)
            layout = str(request.POST.get("layout") or "")
            version = TemplateVersion(template=template, version=0, content=parsed.content, layout=layout)
            channels, render_errors = editor.preview(
                version=version,
                content=parsed.content,
                locale=str(request.POST.get("preview_locale") or default_locale),
                payload=payload,
            )
            errors.update(render_errors)
        return JsonResponse({"errors": errors, "channels": channels})

    def diff_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Show the differences between any two versions of a template (?a=N&b=M)."""
        template = get_object_or_404(self.get_queryset(request), pk=object_id)
        if not self.has_view_permission(request, template):
            raise PermissionDenied
        versions = list(template.versions.order_by("-version"))
        numbers = [v.version for v in versions]
        by_number = {v.version: v for v in versions}

        def pick(name: str, default: int | None) -> int | None:
            try:
                value = int(request.GET.get(name, ""))
            except ValueError:
                return default
            return value if value in by_number else default

        b = pick("b", numbers[0] if numbers else None)
        a = pick("a", numbers[1] if len(numbers) > 1 else b)
        table = ""
        if a is not None and b is not None:
            table = editor.version_diff_table(
                by_number[a].content, by_number[b].content, old_label=f"version {a}", new_label=f"version {b}"
            )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Differences between versions of {template.key}",
            "template_obj": template,
            "numbers": numbers,
            "a": a,
            "b": b,
            "table": mark_safe(table),  # noqa: S308 - difflib.HtmlDiff escapes the content it shows
            "template_url": reverse("admin:templates_app_template_change", args=[template.pk]),
        }
        return TemplateResponse(request, "admin/templates_app/template/diff.html", context)


class PreviewForm(forms.Form):
    """A sample payload and locale to render a version with."""

    payload = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 12, "cols": 80, "style": "font-family: monospace"}),
        initial="{}",
        help_text="JSON object of template variables.",
    )
    locale = forms.CharField(max_length=35, required=False, help_text="e.g. pt-BR; falls back to pt, then default.")

    def clean_payload(self) -> dict[str, Any]:
        """Parse the payload as a JSON object."""
        try:
            payload = json.loads(self.cleaned_data["payload"])
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise forms.ValidationError("The payload must be a JSON object.")
        return payload


@admin.register(TemplateVersion)
class TemplateVersionAdmin(OwnedAdmin):
    """Versions are immutable: view, preview and publish (or roll back) only."""

    list_display = ("__str__", "template", "version", "status", "created_by", "created_at", "published_at", "links")
    list_filter = ("template__category",)
    search_fields = ("template__key", "created_by")
    list_select_related = ("template__published_version",)
    readonly_fields = (
        "template",
        "version",
        "status",
        "created_by",
        "created_at",
        "published_at",
        "layout",
        "links",
        "content_json",
    )
    fields = readonly_fields
    actions = ["publish_version"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    action_permissions = {"publish": PUBLISH_PERMISSION}

    def get_queryset(self, request: HttpRequest) -> QuerySet[TemplateVersion]:
        """Limit a member who may edit only some categories in a project (the Marketing role) to those there."""
        return _without_closed_categories(super().get_queryset(request), request, "template__")

    def has_publish_permission(self, request: HttpRequest, obj: TemplateVersion | None = None) -> bool:
        """Publishing changes what every sender gets, so it takes its own permission (not the editor's).

        With a version: in its template's project; without: in any of the user's projects.
        """
        return self.may(request, "publish", obj)

    status = TemplateVersionInline.status
    content_json = TemplateVersionInline.content_json
    links = TemplateVersionInline.links
    view_links = TemplateVersionInline.view_links

    def get_list_display(self, request: HttpRequest) -> list[str]:  # type: ignore[override]  # a list[str] is one of django-stubs' list | tuple shapes, but list is invariant
        return _with_links(list(self.list_display), request)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:  # type: ignore[override]  # a list[str] is one of django-stubs' list | tuple shapes, but list is invariant
        return _with_links(list(self.fields), request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return _with_links(list(self.readonly_fields), request, obj)

    @admin.action(description="Publish the selected version (or roll back to it)", permissions=["publish"])
    def publish_version(self, request: HttpRequest, queryset: QuerySet[TemplateVersion]) -> HttpResponse | None:
        """Ask to confirm publishing one selected version (a draft, or an older one to roll back to)."""
        versions = list(queryset[:2])
        if len(versions) != 1:
            self.message_user(request, "Select exactly one version to publish.", messages.ERROR)
            return None
        return HttpResponseRedirect(reverse("admin:templates_app_templateversion_publish", args=[versions[0].pk]))

    def _publish(self, request: HttpRequest, version: TemplateVersion) -> None:
        """Publish `version`, audit it and tell the user how it went."""
        try:
            version = template_version_publish(  # audited by the service
                version=version, actor=f"admin:{request.user.get_username()}", audit_actor=request.user
            )
        except ValidationError as exc:
            reasons = "; ".join(f"{k}: {', '.join(v)}" for k, v in _error_lines(exc.detail).items())
            self.message_user(request, f"Not published: {reasons}", messages.ERROR)
            return
        self.message_user(request, f"{version} is now the published version.", messages.SUCCESS)

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "<path:object_id>/preview/",
                self.admin_site.admin_view(self.preview_view),
                name="templates_app_templateversion_preview",
            ),
            path(
                "<path:object_id>/publish/",
                self.admin_site.admin_view(self.publish_view),
                name="templates_app_templateversion_publish",
            ),
        ]
        return own + super().get_urls()

    def publish_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Confirm (GET), then publish (POST) one version, and return to its template."""
        version = get_object_or_404(
            self.get_queryset(request).select_related("template__published_version"), pk=object_id
        )
        if not self.has_publish_permission(request, version):
            raise PermissionDenied
        template_url = reverse("admin:templates_app_template_change", args=[version.template_id])
        if request.method == "POST":
            self._publish(request, version)
            return HttpResponseRedirect(template_url)
        current = version.template.published_version
        table = ""
        if current is not None and current.pk != version.pk:
            table = editor.version_diff_table(
                current.content,
                version.content,
                old_label=f"version {current.version} (published)",
                new_label=f"version {version.version}",
            )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Publish {version}?",
            "version": version,
            "current": current,
            "rollback": current is not None and version.version < current.version,
            "table": mark_safe(table),  # noqa: S308 - difflib.HtmlDiff escapes the content it shows
            "template_url": template_url,
        }
        return TemplateResponse(request, "admin/templates_app/templateversion/publish_confirm.html", context)

    def preview_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Render every channel of a version with a sample payload and locale, or show the render error."""
        version = get_object_or_404(self.get_queryset(request).select_related("template"), pk=object_id)
        if not self.has_view_permission(request, version):
            raise PermissionDenied
        results: list[dict[str, Any]] = []
        error = ""
        if request.method == "POST":
            form = PreviewForm(request.POST)
            if form.is_valid():
                try:
                    # In the template's environment: its layouts are found by key there.
                    with owner_scope(environment_id_of(version)):
                        rendered = render_all(
                            version, locale=form.cleaned_data["locale"], payload=form.cleaned_data["payload"]
                        )
                except RenderError as exc:
                    error = exc.message
                else:
                    results = [
                        {
                            "channel": channel,
                            "locale": r.locale,
                            "parts": _display_parts(channel, r.parts),
                            "sms": sms_preview(str(r.parts.get("text") or "")) if channel == "sms" else None,
                        }
                        for channel, r in rendered.items()
                    ]
        else:
            sample = {name: "" for name in template_variables(version.content)}
            form = PreviewForm(initial={"payload": _pretty(sample), "locale": version.template.default_locale})
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Preview {version}",
            "version": version,
            "status": _version_status(version),
            "form": form,
            "results": results,
            "error": error,
            "can_publish": self.has_publish_permission(request, version) and not _is_current(version),
            "publish_url": reverse("admin:templates_app_templateversion_publish", args=[version.pk]),
            "template_url": reverse("admin:templates_app_template_change", args=[version.template_id]),
        }
        return TemplateResponse(request, "admin/templates_app/templateversion/preview.html", context)


def _display_parts(channel: str, parts: dict[str, Any]) -> list[dict[str, Any]]:
    """Prepare rendered parts for the preview page: structured parts as JSON, HTML also as a sandboxed frame."""
    out = []
    for name, value in parts.items():
        text = value if isinstance(value, str) else _pretty(value)
        out.append({"name": name, "text": text, "html": channel == "email" and name == "html" and bool(value)})
    return out


class LayoutForm(forms.ModelForm):
    """An email layout: saving creates its next version (the one used from then on) through layout_put."""

    html = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 16, "cols": 100}),
        strip=False,
        help_text="HTML with {{ content }} where the message goes; <style> rules are inlined into each email.",
    )
    text = forms.CharField(
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 6, "cols": 100}),
        help_text="Text with {{ content }}; empty: the message's own text (or text derived from its HTML).",
    )

    class Meta:
        model = Layout
        fields = ("environment", "key")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["key"].disabled = True
            latest = self.instance.versions.order_by("-version").first()
            if latest is not None:
                self.fields["html"].initial = latest.html
                self.fields["text"].initial = latest.text

    def clean(self) -> dict[str, Any]:
        """Validate as layout_put will, errors beside the fields."""
        data = cast(dict[str, Any], super().clean())
        try:
            layout_put_validate(
                key=data.get("key") or self.instance.key, html=data.get("html", ""), text=data.get("text", "")
            )
        except ValidationError as exc:
            detail = exc.detail if isinstance(exc.detail, dict) else {"html": exc.detail}
            for name, reasons in detail.items():
                for reason in reasons if isinstance(reasons, list) else [reasons]:
                    self.add_error(name if name in self.fields else None, str(reason))
        return data


class LayoutVersionInline(admin.TabularInline):
    """The versions of a layout, newest first (immutable), each but the newest with a roll-back link."""

    model = LayoutVersion
    fields = ("version", "created_by", "created_at", "rollback")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("-version",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="")
    def rollback(self, obj: LayoutVersion) -> str:
        if obj.pk is None:
            return ""
        newest = obj.layout.versions.order_by("-version").values_list("version", flat=True).first()
        return version_rollback_link(obj.layout, obj.version, current=newest)


@admin.register(Layout)
class LayoutAdmin(PromotionAdmin):
    """Email layouts: saving creates a new version through layout_put (audited); versions are immutable.

    A layout of a test environment is promoted to live from its page; any environment's layout rolls back to an
    earlier version from its versions (as its next version).
    """

    form = LayoutForm
    list_display = ("key", "updated_at")
    search_fields = ("key",)
    readonly_fields = ("promotion", "created_at", "updated_at")
    fields = ("environment", "key", "html", "text", "promotion", "created_at", "updated_at")
    inlines = [LayoutVersionInline]
    promotion_kind = "layout"

    def promotion_reader(self) -> Reader:
        return layouts_in_use

    def promotion_run(self, request: HttpRequest, obj: Layout) -> int:
        version = layout_promote(
            key=obj.key,
            environment_id=owner_id(obj),
            actor=f"admin:{request.user.get_username()}",
            audit_actor=request.user,
        )
        return version.version

    def rollback_versions(self, obj: Layout) -> tuple[dict[int, dict[str, Any]], int | None]:
        versions = {v.version: {"html": v.html, "text": v.text} for v in obj.versions.all()}
        return versions, max(versions, default=None)

    def rollback_run(self, request: HttpRequest, obj: Layout, version: int) -> int:
        with owner_scope(owner_id(obj)):
            made = layout_rollback(
                key=obj.key, version=version, actor=f"admin:{request.user.get_username()}", audit_actor=request.user
            )
        return made.version

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:  # type: ignore[override]  # a list[str] is one of django-stubs' list | tuple shapes, but list is invariant
        fields = list(self.fields)
        return fields if obj is not None else [name for name in fields if name != "promotion"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Templates name layouts by key: deleting one would fail every email that uses it.
        return False

    def save_model(self, request: HttpRequest, obj: Layout, form: LayoutForm, change: bool) -> None:
        """Write the new version through the service (which audits it), in the layout's environment."""
        with self.owned(request, obj, change=change):
            version = layout_put(
                key=obj.key,
                html=form.cleaned_data["html"],
                text=form.cleaned_data.get("text") or "",
                actor=f"admin:{request.user.get_username()}",
                audit_actor=request.user,
            )
        obj.pk = version.layout.pk
        obj.refresh_from_db()
        messages.info(request, f"Version {version.version} of layout '{obj.key}' saved.")
