"""Admin of API clients: adding one creates its key and shows it once; keys are rotated the same way."""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from audit.admin import AuditedAdminMixin
from core.ratelimit import clean_rate_text
from core.scopes import DEFAULT_SCOPES, SCOPES
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_assign_key, api_client_rotate_key, webhook_secret_problem
from projects.admin import OwnedAdmin
from projects.models import DEFAULT_PROJECT_SLUG, Environment


def mode_badge(mode: str) -> str:
    """Return the badge of a client's mode: a visible TEST for test clients, plain text for live ones."""
    if mode == ApiClient.Mode.TEST:
        return format_html(
            '<span class="mode-badge mode-test" style="background:#b45309;color:#fff;padding:1px 6px;'
            'border-radius:3px;font-weight:bold">{}</span>',
            "TEST",
        )
    return format_html('<span class="mode-badge mode-live">{}</span>', "live")


class ApiClientForm(forms.ModelForm):
    """An API client's editable fields, with its scopes as checkboxes of the known names."""

    scopes = forms.MultipleChoiceField(
        choices=list(SCOPES.items()), widget=forms.CheckboxSelectMultiple, required=False, initial=list(DEFAULT_SCOPES)
    )

    class Meta:
        model = ApiClient
        fields = (
            "environment", "name", "mode", "scopes", "allowed_categories", "rate_limit", "webhook_url",
            "webhook_secret", "is_active",
        )  # fmt: skip
        help_texts = {
            "environment": "The project environment the key belongs to, and everything it makes; its name is the "
            "key's mode. Left empty: the default project's environment of the mode below.",
            "mode": "Test: the whole pipeline runs, but every delivery goes to the sandbox provider.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "mode" in self.fields:  # only on add: the mode is read-only afterwards
            self.fields["mode"].required = False  # left out, a client is live, as with create_api_client
        if "environment" in self.fields:  # only on add, as the mode
            self.fields["environment"].required = False

    def clean_mode(self) -> str:
        return self.cleaned_data.get("mode") or ApiClient.Mode.LIVE

    def clean(self) -> dict[str, Any]:
        """Make the mode the environment's name; with no environment, take the default project's of the mode."""
        data = cast(dict[str, Any], super().clean())  # ModelForm.clean returns cleaned_data, never None
        if "environment" not in self.fields:
            return data
        environment = data.get("environment")
        if environment is None:
            # What the user may choose (OwnedAdmin narrows the field to their projects).
            offered = cast("QuerySet[Environment]", cast(forms.ModelChoiceField, self.fields["environment"]).queryset)
            environment = offered.filter(
                project__slug=DEFAULT_PROJECT_SLUG, name=data.get("mode") or ApiClient.Mode.LIVE
            ).first()
            if environment is None:  # a member of projects other than `default`
                self.add_error("environment", "Choose the project environment the key belongs to.")
                return data
            data["environment"] = environment
        data["mode"] = environment.name
        return data

    def clean_rate_limit(self) -> str:
        return clean_rate_text(self.cleaned_data.get("rate_limit"))

    def clean_webhook_secret(self) -> str:
        secret = (self.cleaned_data.get("webhook_secret") or "").strip()
        problem = webhook_secret_problem(secret) if secret else None
        if problem:
            raise forms.ValidationError(problem)
        return secret


@admin.register(ApiClient)
class ApiClientAdmin(AuditedAdminMixin, OwnedAdmin):
    """Calling services. Adding one creates its key and shows it once; "Rotate key" replaces it, shown once."""

    form = ApiClientForm
    list_display = (
        "name", "environment", "mode_badge", "key_prefix", "scopes", "allowed_categories", "rate_limit", "is_active",
        "created_at", "last_used_at",
    )  # fmt: skip
    list_filter = ("mode", "is_active")
    search_fields = ("name", "key_prefix")
    readonly_fields = ("key_prefix", "created_at", "last_used_at")
    actions = ("rotate_keys",)
    audit_target_type = "api_client"

    def get_readonly_fields(self, request: HttpRequest, obj: ApiClient | None = None) -> Any:
        # The mode is chosen once: a notification's mode is its client's, so a later change would relabel history.
        fields = tuple(super().get_readonly_fields(request, obj))
        return (*fields, "mode") if obj is not None else fields

    @admin.display(description="mode", ordering="mode")
    def mode_badge(self, obj: ApiClient) -> str:
        """Mark test clients at a glance."""
        return mode_badge(obj.mode)

    def save_model(self, request: HttpRequest, obj: ApiClient, form: Any, change: bool) -> None:
        if not change:
            # The raw key lives only on this request, for the page that shows it once; the row keeps its hash.
            # Our own request attribute, read back below (getattr) on this request.
            request._new_api_keys = [(obj, api_client_assign_key(client=obj))]  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)

    def response_add(self, request: HttpRequest, obj: ApiClient, post_url_continue: str | None = None) -> Any:
        keys = getattr(request, "_new_api_keys", None)
        if keys:
            return self._show_keys(request, keys, "API client created")
        return super().response_add(request, obj, post_url_continue)

    # Rotating takes the change permission on API clients, not one of its own: it rewrites the row's key (the
    # credential the client is), and who may change a client can already deactivate it or change its scopes,
    # which weighs as much. A staff user who may only view clients is not offered it, and posting it anyway runs
    # nothing. A permission of its own would need a migration of the model for no finer cut that anyone uses.
    @admin.action(
        description="Rotate the API key of the selected clients (the old keys stop working)", permissions=["change"]
    )
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
            "changelist_url": reverse("admin:clients_apiclient_changelist"),
        }
        response = TemplateResponse(request, "admin/clients/apiclient/keys_shown.html", context)
        response["Cache-Control"] = "no-store"
        return response
