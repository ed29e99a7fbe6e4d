"""Admin for support staff and operators: API clients, notifications, deliveries with their history."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from audit.admin import AuditedAdminMixin
from notifier.deadletters.admin import DeadLetterAdmin
from notifier.models import ApiClient, DeadLetter, Delivery, DeliveryEvent, FanoutLane, Notification
from notifier.scopes import DEFAULT_SCOPES, SCOPES
from notifier.services import api_client_assign_key, api_client_rotate_key, webhook_secret_problem
from notifier.throttle import parse_rate

admin.site.register(DeadLetter, DeadLetterAdmin)


class ReadOnlyAdmin(admin.ModelAdmin):
    """An admin that can look but not touch: history is written only by the pipeline."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ApiClientForm(forms.ModelForm):
    """An API client's editable fields, with its scopes as checkboxes of the known names."""

    scopes = forms.MultipleChoiceField(
        choices=list(SCOPES.items()), widget=forms.CheckboxSelectMultiple, required=False, initial=list(DEFAULT_SCOPES)
    )

    class Meta:
        model = ApiClient
        fields = ("name", "scopes", "allowed_categories", "rate_limit", "webhook_url", "webhook_secret", "is_active")

    def clean_rate_limit(self) -> str:
        value = (self.cleaned_data.get("rate_limit") or "").strip()
        if value:
            try:
                parse_rate(value)
            except ValueError as exc:
                raise forms.ValidationError(str(exc)) from None
        return value

    def clean_webhook_secret(self) -> str:
        secret = (self.cleaned_data.get("webhook_secret") or "").strip()
        problem = webhook_secret_problem(secret) if secret else None
        if problem:
            raise forms.ValidationError(problem)
        return secret


@admin.register(ApiClient)
class ApiClientAdmin(AuditedAdminMixin, admin.ModelAdmin):
    """Calling services. Adding one creates its key and shows it once; "Rotate key" replaces it, shown once."""

    form = ApiClientForm
    list_display = (
        "name", "key_prefix", "scopes", "allowed_categories", "rate_limit", "is_active", "created_at", "last_used_at"
    )  # fmt: skip
    list_filter = ("is_active",)
    search_fields = ("name", "key_prefix")
    readonly_fields = ("key_prefix", "created_at", "last_used_at")
    actions = ("rotate_keys",)
    audit_target_type = "api_client"

    def save_model(self, request: HttpRequest, obj: ApiClient, form: Any, change: bool) -> None:
        if not change:
            # The raw key lives only on this request, for the page that shows it once; the row keeps its hash.
            request._new_api_keys = [(obj, api_client_assign_key(client=obj))]  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)

    def response_add(self, request: HttpRequest, obj: ApiClient, post_url_continue: str | None = None) -> Any:
        keys = getattr(request, "_new_api_keys", None)
        if keys:
            return self._show_keys(request, keys, "API client created")
        return super().response_add(request, obj, post_url_continue)

    @admin.action(description="Rotate the API key of the selected clients (the old keys stop working)")
    def rotate_keys(self, request: HttpRequest, queryset: Any) -> TemplateResponse:
        keys = [
            (client, api_client_rotate_key(client=client, audit_actor=request.user))
            for client in queryset.order_by("name")
        ]
        return self._show_keys(request, keys, "API keys rotated")

    def _show_keys(self, request: HttpRequest, keys: list[tuple[ApiClient, str]], title: str) -> TemplateResponse:
        """Render the new keys once; they are not stored anywhere but in the caller's copy."""
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "keys": keys,
            "opts": self.model._meta,
            "changelist_url": reverse("admin:notifier_apiclient_changelist"),
        }
        response = TemplateResponse(request, "admin/notifier/apiclient/keys_shown.html", context)
        response["Cache-Control"] = "no-store"
        return response


class DeliveryEventInline(admin.TabularInline):
    model = DeliveryEvent
    fields = ("at", "status", "detail")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("id",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class FanoutLaneInline(admin.TabularInline):
    """Where each lane of a topic fan-out stands: its range, checkpoint and count (docs/fanout.md)."""

    model = FanoutLane
    fields = ("lane", "cursor", "upper", "processed", "done", "updated_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("lane",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    """Accepted notifications; a topic notification shows its fan-out lanes."""

    list_display = ("id", "client", "category", "template_key", "template_version", "user_id", "topic", "status")
    list_filter = ("status", "category", "priority")
    search_fields = ("=id", "=user_id", "=dedup_key", "template_key")
    list_select_related = ("client", "topic")
    show_full_result_count = False
    inlines = (FanoutLaneInline,)


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    """Deliveries, with the template version used and the full event history (read-only)."""

    list_display = ("id", "channel", "status", "provider", "attempts", "version_used", "created_at")
    list_filter = ("status", "channel", "provider", "priority")
    search_fields = ("=id", "=notification__id", "=provider_message_id", "=recipient__user_id")
    raw_id_fields = ("notification", "recipient", "template_version")
    list_select_related = ("template_version__template",)
    inlines = [DeliveryEventInline]
    show_full_result_count = False
    readonly_fields = ("version_used",)

    @admin.display(description="template version")
    def version_used(self, obj: Delivery) -> str:
        """Link to the preview of the template version this delivery was rendered from."""
        if obj.template_version_id is None:
            return "-"
        url = reverse("admin:templates_app_templateversion_preview", args=[obj.template_version_id])
        return format_html('<a href="{}">{}</a>', url, obj.template_version)


# Campaign admin lives with the campaigns; importing it registers it.
import notifier.campaigns.admin  # noqa: E402

# So are the event endpoints and their attempts.
import notifier.statusevents.admin  # noqa: E402, F401
