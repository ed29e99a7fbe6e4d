"""Admin for recipients (with devices), topics and the suppression list; list pages show no personal data."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join

from audit.admin import AuditedAdminMixin
from preferences import imports
from preferences.models import Device, Recipient, RecipientImport, Suppression, Topic
from preferences.phones import InvalidPhoneNumber, phone_normalize
from preferences.selectors import topic_get
from preferences.tasks import import_enqueue
from projects.admin import OwnedAdmin
from projects.scoping import owner_scope


class DeviceInline(admin.TabularInline):
    """A recipient's push tokens."""

    model = Device
    extra = 0
    fields = ("platform", "token", "active", "created_at", "deactivated_at")
    readonly_fields = ("created_at", "deactivated_at")


class RecipientForm(forms.ModelForm):
    """A recipient's fields; the phone number is checked and stored in E.164 as over the API."""

    class Meta:
        model = Recipient
        exclude: tuple[str, ...] = ()

    def clean_phone(self) -> str:
        value = (self.cleaned_data.get("phone") or "").strip()
        if not value:
            return ""
        try:
            return phone_normalize(value)
        except InvalidPhoneNumber as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(Recipient)
class RecipientAdmin(AuditedAdminMixin, OwnedAdmin):
    """Support staff look recipients up by user_id; contact data is shown only on the detail page."""

    form = RecipientForm
    list_display = ("user_id", "locale", "timezone", "opted_out", "erased_at", "created_at")
    list_filter = ("opted_out", ("erased_at", admin.EmptyFieldListFilter))
    search_fields = ("=user_id", "user_id")
    readonly_fields = ("erased_at", "created_at", "updated_at")
    inlines = [DeviceInline]
    show_full_result_count = False
    audit_target_type = "recipient"

    def audit_target_id(self, obj: Recipient) -> str:
        return obj.user_id


@admin.register(Topic)
class TopicAdmin(OwnedAdmin):
    """Topics with their subscriber counts."""

    list_display = ("key", "name", "subscriber_count", "created_at")
    search_fields = ("key", "name")
    readonly_fields = ("created_at",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Topic]:
        return super().get_queryset(request).annotate(_subscribers=Count("subscriptions"))

    @admin.display(description="subscribers", ordering="_subscribers")
    def subscriber_count(self, obj: Topic) -> int:
        return obj._subscribers  # type: ignore[attr-defined]  # annotated by get_queryset above


@admin.register(Suppression)
class SuppressionAdmin(AuditedAdminMixin, OwnedAdmin):
    """The suppression list; an address is found by exact search, never listed in full."""

    list_display = ("id", "channel", "source", "reason", "created_at")
    list_filter = ("channel", "source")
    search_fields = ("=address",)
    readonly_fields = ("created_at",)
    show_full_result_count = False
    audit_target_type = "suppression"


class RecipientImportForm(forms.ModelForm):
    """The upload of an import: the environment, the file, and a topic every row joins."""

    upload = forms.FileField(label="File", help_text="CSV with a header row, or JSON Lines (one object per line).")

    class Meta:
        model = RecipientImport
        fields = ("environment", "upload", "topic_key")

    def clean_upload(self) -> Any:
        upload = self.cleaned_data["upload"]
        if upload.size > imports.MAX_UPLOAD_BYTES:
            raise forms.ValidationError(f"At most {imports.MAX_UPLOAD_BYTES // (1024 * 1024)} MB.")
        try:
            self.text = upload.read().decode("utf-8-sig")
        except UnicodeDecodeError:
            raise forms.ValidationError("Must be UTF-8 text.") from None
        self.file_format = imports.file_format_of(upload.name, self.text[:4096])
        self.columns = imports.file_columns(self.text, self.file_format)
        if not self.columns:
            raise forms.ValidationError("No columns found: a CSV needs a header row, JSON Lines objects.")
        return upload

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        environment, topic = data.get("environment"), data.get("topic_key")
        if environment is not None and topic:
            with owner_scope(environment.pk):
                if topic_get(key=topic) is None:
                    self.add_error("topic_key", f"No topic '{topic}' in {environment}.")
        return data


def mapping_form(columns: list[str], initial: dict[str, str]) -> type[forms.Form]:
    """Return a form with one choice per file column: the recipient field it fills, or none."""
    choices = [("", "(ignore)"), *((t, t) for t in imports.import_targets())]
    fields = {
        f"column_{i}": forms.ChoiceField(label=column, choices=choices, required=False, initial=initial.get(column, ""))
        for i, column in enumerate(columns)
    }

    def clean(form: forms.Form) -> dict[str, Any]:
        data = forms.Form.clean(form) or {}
        targets = [value for value in data.values() if value]
        if "user_id" not in targets:
            raise forms.ValidationError("Map one column to user_id.")
        twice = sorted({t for t in targets if targets.count(t) > 1})
        if twice:
            raise forms.ValidationError(f"Each field from one column only: {', '.join(twice)}.")
        return data

    return type("MappingForm", (forms.Form,), {**fields, "clean": clean})


@admin.register(RecipientImport)
class RecipientImportAdmin(OwnedAdmin):
    """Imports of recipients from a file: upload, map the columns, dry run, then import; progress and refused rows.

    The import runs as a Celery task on the maintenance queue, a chunk per transaction (preferences.imports);
    its page shows its progress until it is done, then what it created, updated and refused, and why.
    """

    form = RecipientImportForm
    change_form_template = "admin/preferences/recipientimport/change_form.html"
    list_display = (
        "name",
        "environment",
        "status",
        "dry_run",
        "progress",
        "created",
        "updated",
        "refused",
        "created_at",
    )
    list_filter = ("status", "dry_run")
    ordering = ("-created_at",)
    readonly_fields = (
        "name", "file_format", "topic_key", "dry_run", "status", "progress", "created", "updated", "refused",
        "mapping", "refused_rows", "error", "created_by", "created_at", "finished_at",
    )  # fmt: skip

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ("environment", "upload", "topic_key")
        return ("environment", *self.readonly_fields)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return super().get_readonly_fields(request, obj) if obj is not None else ()

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # An import is not edited: its page shows it; starting one takes the right to change recipients.
        return obj is None and super().has_change_permission(request, obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and request.user.has_perm("preferences.change_recipient")

    @admin.display(description="progress")
    def progress(self, obj: RecipientImport) -> str:
        if not obj.total_lines:
            return "—"
        done = min(obj.committed_line, obj.total_lines)
        percent = 100 * done // obj.total_lines
        return format_html(
            '<progress id="import-progress" max="{}" value="{}"></progress> {} of {} lines ({} %)',
            obj.total_lines, done, f"{done:,}", f"{obj.total_lines:,}", percent,
        )  # fmt: skip

    @admin.display(description="refused rows")
    def refused_rows(self, obj: RecipientImport) -> str:
        if not obj.refusals:
            return "—"
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            ((r["line"], r["field"], r["reason"]) for r in obj.refusals[:200]),
        )
        more = f" (the first 200 of {obj.refused:,})" if obj.refused > 200 else ""
        return format_html(
            '<table id="refused-rows"><thead><tr><th>line</th><th>field</th><th>reason</th></tr></thead>'
            "<tbody>{}</tbody></table>{}",
            rows, more,
        )  # fmt: skip

    def save_model(self, request: HttpRequest, obj: RecipientImport, form: Any, change: bool) -> None:
        obj.name = form.cleaned_data["upload"].name[:255]
        obj.content = form.text
        obj.file_format = form.file_format
        obj.mapping = imports.default_mapping(form.columns)
        obj.total_lines = len(form.text.splitlines())
        obj.created_by = request.user.get_username()
        super().save_model(request, obj, form, change)

    def response_add(self, request: HttpRequest, obj: RecipientImport, post_url_continue: str | None = None) -> Any:
        return HttpResponseRedirect(reverse("admin:preferences_recipientimport_mapping", args=[obj.pk]))

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "<path:object_id>/mapping/",
                self.admin_site.admin_view(self.mapping_view),
                name="preferences_recipientimport_mapping",
            ),
            path(
                "<path:object_id>/run/",
                self.admin_site.admin_view(self.run_view),
                name="preferences_recipientimport_run",
            ),
        ]
        return own + super().get_urls()

    def _startable(self, request: HttpRequest, object_id: str) -> RecipientImport:
        job = get_object_or_404(self.get_queryset(request), pk=object_id)
        if not request.user.has_perm("preferences.change_recipient") or not self.may(request, "add", job):
            raise PermissionDenied
        return job

    def _start(self, request: HttpRequest, job: RecipientImport) -> HttpResponse:
        transaction.on_commit(lambda: import_enqueue(job))
        what = "Dry run" if job.dry_run else "Import"
        self.message_user(request, f"{what} of {job.name} queued.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:preferences_recipientimport_change", args=[job.pk]))

    def mapping_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Map the file's columns to recipient fields (GET), then start a dry run or the import (POST)."""
        job = self._startable(request, object_id)
        if job.status != RecipientImport.Status.PENDING:
            return HttpResponseRedirect(reverse("admin:preferences_recipientimport_change", args=[job.pk]))
        columns = imports.file_columns(job.content, job.file_format)
        form_class = mapping_form(columns, job.mapping)
        form = form_class(request.POST or None)
        if request.method == "POST" and form.is_valid():
            job.mapping = {columns[int(k.split("_")[1])]: v for k, v in form.cleaned_data.items() if v}
            job.dry_run = "dry_run" in request.POST
            job.save(update_fields=["mapping", "dry_run"])
            return self._start(request, job)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Map the columns of {job.name}",
            "job": job,
            "form": form,
            "object_url": reverse("admin:preferences_recipientimport_change", args=[job.pk]),
        }
        return TemplateResponse(request, "admin/preferences/recipientimport/mapping.html", context)

    def run_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Import for real what a finished dry run checked (POST): a new import of the same file and mapping."""
        job = self._startable(request, object_id)
        if request.method != "POST" or not job.dry_run or job.status != RecipientImport.Status.DONE:
            return HttpResponseRedirect(reverse("admin:preferences_recipientimport_change", args=[job.pk]))
        real = RecipientImport.objects.create(
            environment_id=job.environment_id, name=job.name, file_format=job.file_format, content=job.content,
            mapping=job.mapping, topic_key=job.topic_key, total_lines=job.total_lines,
            created_by=request.user.get_username(),
        )  # fmt: skip
        return self._start(request, real)

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        obj = kwargs.get("obj")
        if obj is not None:
            context["import_running"] = obj.status in (RecipientImport.Status.QUEUED, RecipientImport.Status.RUNNING)
            context["import_runnable"] = obj.dry_run and obj.status == RecipientImport.Status.DONE
            context["import_pending"] = obj.status == RecipientImport.Status.PENDING
        return super().render_change_form(request, context, *args, **kwargs)
