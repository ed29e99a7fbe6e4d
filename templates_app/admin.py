"""Admin for support staff: edit templates (each save makes a new immutable version), publish, preview."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST
from rest_framework.exceptions import ValidationError

from templates_app.models import Template, TemplateVersion
from templates_app.rendering import RenderError, render_all, template_variables
from templates_app.services import (
    template_describe,
    template_put,
    template_put_validate,
    template_version_publish,
)

HEADER_FIELDS = ("key", "category", "default_locale")


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


class TemplateForm(forms.ModelForm):
    """The template's header plus the content of the version that saving creates."""

    category = forms.ChoiceField(choices=())
    content = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 30, "cols": 110, "style": "font-family: monospace"}),
        required=False,
        help_text='JSON: {"locale": {"channel": {"part": "template"}}}. Saving a change creates a new version; '
        "versions themselves are never edited.",
    )
    publish = forms.BooleanField(
        required=False, initial=True, help_text="Publish the new version (unchecked keeps it as a draft)."
    )

    class Meta:
        model = Template
        fields = ("key", "category", "default_locale", "description")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["category"].choices = [(c, c) for c in settings.NOTIFIER_CATEGORIES]
        self.latest_content: dict[str, Any] | None = None
        if self.instance.pk:
            self.fields["key"].disabled = True
            latest = self.instance.versions.order_by("-version").only("content").first()
            if latest is not None:
                self.latest_content = latest.content
                self.fields["content"].initial = _pretty(latest.content)
        self.creates_version = False
        self.canonical_content: dict[str, Any] = {}

    def clean(self) -> dict[str, Any]:
        """Parse the content and validate the new version exactly as template_put will."""
        data = super().clean()
        raw = (data.get("content") or "").strip()
        if not raw:
            if not self.instance.pk:
                self.add_error("content", "A new template needs content.")
            content = self.latest_content
        else:
            try:
                content = json.loads(raw)
            except json.JSONDecodeError as exc:
                self.add_error("content", f"Not valid JSON: {exc}")
                return data
        header_changed = self.instance.pk and any(
            field in self.changed_data for field in ("category", "default_locale")
        )
        self.creates_version = not self.instance.pk or content != self.latest_content or bool(header_changed)
        if not self.creates_version or self.errors:
            return data
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
            for field, reasons in _error_lines(exc.detail).items():
                target = field if field in HEADER_FIELDS else "content"
                prefix = "" if target == field else f"{field}: "
                for reason in reasons:
                    self.add_error(target, f"{prefix}{reason}")
        return data


class TemplateVersionInline(admin.StackedInline):
    """The versions of a template, newest first; read-only because versions are immutable."""

    model = TemplateVersion
    fields = ("version", "status", "created_by", "created_at", "published_at", "channels_list", "links", "content_json")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ("-version",)

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
        url = reverse("admin:templates_app_templateversion_preview", args=[obj.pk])
        return format_html('<a href="{}">Preview{}</a>', url, "" if _is_current(obj) else " / publish")


def _is_current(version: TemplateVersion) -> bool:
    """Say whether `version` is its template's published version."""
    return version.pk == version.template.published_version_id


@admin.register(Template)
class TemplateAdmin(admin.ModelAdmin):
    """Templates: saving new content creates (and by default publishes) a new version through template_put."""

    form = TemplateForm
    list_display = ("key", "category", "default_locale", "published", "updated_at")
    list_filter = ("category",)
    search_fields = ("key", "description")
    list_select_related = ("published_version",)
    readonly_fields = ("published_version", "created_at", "updated_at")
    fields = (
        "key",
        "category",
        "default_locale",
        "description",
        "published_version",
        "content",
        "publish",
        "created_at",
        "updated_at",
    )
    inlines = [TemplateVersionInline]

    @admin.display(description="published version", ordering="published_version__version")
    def published(self, obj: Template) -> str:
        return f"v{obj.published_version.version}" if obj.published_version else "—"

    def save_model(self, request: HttpRequest, obj: Template, form: TemplateForm, change: bool) -> None:
        """Write through the services: a new version when the content or header changed, else the description."""
        if form.creates_version:
            version = template_put(
                key=obj.key,
                category=form.cleaned_data["category"],
                default_locale=form.cleaned_data["default_locale"],
                content=form.canonical_content,
                publish=bool(form.cleaned_data.get("publish")),
                actor=f"admin:{request.user.get_username()}",
                audit_actor=request.user,
            )
            obj.pk = version.template.pk
            obj.refresh_from_db()
            state = "published" if version.published_at else "saved as a draft"
            messages.info(request, f"Version {version.version} of '{obj.key}' {state}.")
        if "description" in form.changed_data:
            template_describe(template=obj, description=form.cleaned_data["description"])


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
class TemplateVersionAdmin(admin.ModelAdmin):
    """Versions are immutable: view, preview and publish only."""

    list_display = ("__str__", "template", "version", "status", "created_by", "created_at", "published_at", "links")
    list_filter = ("template__category",)
    search_fields = ("template__key", "created_by")
    list_select_related = ("template",)
    readonly_fields = (
        "template",
        "version",
        "status",
        "created_by",
        "created_at",
        "published_at",
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

    def has_publish_permission(self, request: HttpRequest) -> bool:
        """Publishing changes the template, so it takes the permission to change templates."""
        return request.user.has_perm("templates_app.change_template")

    status = TemplateVersionInline.status
    content_json = TemplateVersionInline.content_json
    links = TemplateVersionInline.links

    @admin.action(description="Publish the selected version", permissions=["publish"])
    def publish_version(self, request: HttpRequest, queryset: QuerySet[TemplateVersion]) -> None:
        """Publish one selected version (a draft, or an older one to roll back to)."""
        versions = list(queryset[:2])
        if len(versions) != 1:
            self.message_user(request, "Select exactly one version to publish.", messages.ERROR)
            return
        self._publish(request, versions[0])

    def _publish(self, request: HttpRequest, version: TemplateVersion) -> None:
        """Publish `version` and tell the user how it went."""
        try:
            version = template_version_publish(
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
                self.admin_site.admin_view(require_POST(self.publish_view)),
                name="templates_app_templateversion_publish",
            ),
        ]
        return own + super().get_urls()

    def publish_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Publish one version from its preview page, then return to the template."""
        version = get_object_or_404(TemplateVersion.objects.select_related("template"), pk=object_id)
        if not self.has_publish_permission(request):
            raise PermissionDenied
        self._publish(request, version)
        return HttpResponseRedirect(reverse("admin:templates_app_template_change", args=[version.template_id]))

    def preview_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Render every channel of a version with a sample payload and locale, or show the render error."""
        version = get_object_or_404(TemplateVersion.objects.select_related("template"), pk=object_id)
        if not self.has_view_permission(request, version):
            raise PermissionDenied
        results: list[dict[str, Any]] = []
        error = ""
        if request.method == "POST":
            form = PreviewForm(request.POST)
            if form.is_valid():
                try:
                    rendered = render_all(
                        version, locale=form.cleaned_data["locale"], payload=form.cleaned_data["payload"]
                    )
                except RenderError as exc:
                    error = exc.message
                else:
                    results = [
                        {"channel": channel, "locale": r.locale, "parts": _display_parts(channel, r.parts)}
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
            "can_publish": self.has_publish_permission(request) and not _is_current(version),
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
