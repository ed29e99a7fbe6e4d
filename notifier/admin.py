"""Admin for support staff and operators: API clients, notifications, deliveries with their history."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from audit.admin import AuditedAdminMixin
from core.scopes import DEFAULT_SCOPES, SCOPES
from notifier.deadletters.admin import DeadLetterAdmin
from notifier.models import ApiClient, DeadLetter, Delivery, FanoutLane, Notification
from notifier.selectors import delivery_compliance, delivery_rendered, delivery_search, delivery_timeline
from notifier.services import CANCELLABLE, api_client_assign_key, api_client_rotate_key, webhook_secret_problem
from notifier.support import (
    RESENDABLE,
    SupportActionError,
    delivery_address_suppress,
    delivery_address_unsuppress,
    delivery_cancel,
    delivery_resend,
)
from notifier.throttle import parse_rate
from preferences.models import Suppression

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
            # Our own request attribute, read back below (getattr) on this request.
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
    """Deliveries: find a customer's message, read its whole story, resend, cancel, suppress its address."""

    change_form_template = "admin/notifier/delivery/change_form.html"
    list_display = ("id", "channel", "address", "status", "provider", "attempts", "version_used", "created_at")
    list_filter = ("status", "channel", "provider", "priority")
    # The search box runs notifier.selectors.delivery_search (get_search_results), not these fields.
    search_fields = ("=address",)
    search_help_text = "Exact email, phone, user id, provider message id, notification id, dedup key or delivery id."
    raw_id_fields = ("notification", "recipient", "template_version", "resent_from")
    list_select_related = ("template_version__template",)
    show_full_result_count = False
    readonly_fields = ("version_used",)
    actions = ("resend_selected", "cancel_selected")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Delivery], search_term: str
    ) -> tuple[QuerySet[Delivery], bool]:
        """Search with the indexed lookups of delivery_search (exact terms, never a LIKE over millions)."""
        if not search_term.strip():
            return queryset, False
        found = delivery_search(query=search_term)
        return queryset.filter(pk__in=found.values("pk")), False

    @admin.display(description="template version")
    def version_used(self, obj: Delivery) -> str:
        """Link to the preview of the template version this delivery was rendered from."""
        if obj.template_version_id is None:
            return "-"
        url = reverse("admin:templates_app_templateversion_preview", args=[obj.template_version_id])
        return format_html('<a href="{}">{}</a>', url, obj.template_version)

    def has_resend_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("notifier.resend_delivery")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("notifier.cancel_delivery")

    def has_suppress_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("preferences.add_suppression")

    def has_unsuppress_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("preferences.delete_suppression")

    @admin.action(description="Resend the selected deliveries", permissions=["resend"])
    def resend_selected(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        """Resend each selected delivery as a new one (compliance checked again)."""
        for delivery in queryset.select_related("notification__client", "recipient")[:100]:
            self._resend(request, delivery)

    @admin.action(description="Cancel the selected deliveries (those not yet sent)", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        """Cancel each selected delivery that is still waiting."""
        cancelled = sum(delivery_cancel(delivery=d, actor=request.user) for d in queryset[:1000])
        self.message_user(request, f"{cancelled} deliveries cancelled (those already sent are left alone).")

    def _resend(self, request: HttpRequest, delivery: Delivery) -> Delivery | None:
        try:
            new = delivery_resend(delivery=delivery, actor=request.user)
        except SupportActionError as exc:
            self.message_user(request, str(exc), messages.WARNING)
            return None
        self.message_user(request, f"Delivery #{delivery.pk} resent as #{new.pk} ({new.status}).", messages.SUCCESS)
        return new

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                f"<path:object_id>/{name}/",
                self.admin_site.admin_view(require_POST(self.act_view)),
                {"action": name},
                name=f"notifier_delivery_{name}",
            )
            for name in ("resend", "cancel", "suppress", "unsuppress")
        ]
        return own + super().get_urls()

    def act_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """Apply one action to one delivery from its page, then show the page (or the new delivery's)."""
        delivery = get_object_or_404(Delivery.objects.select_related("notification__client", "recipient"), pk=object_id)
        allowed = {
            "resend": self.has_resend_permission,
            "cancel": self.has_cancel_permission,
            "suppress": self.has_suppress_permission,
            "unsuppress": self.has_unsuppress_permission,
        }[action](request)
        if not allowed:
            raise PermissionDenied
        target = delivery.pk
        try:
            if action == "resend":
                new = self._resend(request, delivery)
                target = new.pk if new is not None else target
            elif action == "cancel":
                done = delivery_cancel(delivery=delivery, actor=request.user)
                self.message_user(
                    request,
                    "Cancelled." if done else f"Not cancelled: the delivery is {delivery.status}.",
                    messages.SUCCESS if done else messages.WARNING,
                )
            elif action == "suppress":
                delivery_address_suppress(delivery=delivery, actor=request.user)
                self.message_user(request, f"The address is now suppressed on {delivery.channel}.", messages.SUCCESS)
            else:
                removed = delivery_address_unsuppress(delivery=delivery, actor=request.user)
                self.message_user(
                    request, "The address is no longer suppressed." if removed else "The address was not suppressed."
                )
        except SupportActionError as exc:
            self.message_user(request, str(exc), messages.WARNING)
        return HttpResponseRedirect(reverse("admin:notifier_delivery_change", args=[target]))

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Add the story of the delivery: timeline, content as sent, compliance, and what can be done."""
        delivery = (
            Delivery.objects.select_related("notification__client", "recipient", "template_version__template")
            .filter(pk=object_id)
            .first()
        )
        context = dict(extra_context or {})
        if delivery is not None and self.has_view_permission(request, delivery):
            suppressed = (
                bool(delivery.address)
                and Suppression.objects.filter(channel=delivery.channel, address=delivery.address).exists()
            )
            context.update(
                {
                    "delivery": delivery,
                    "timeline": delivery_timeline(delivery=delivery),
                    "rendered": delivery_rendered(delivery=delivery),
                    "compliance": delivery_compliance(delivery=delivery),
                    "resends": list(delivery.resends.order_by("id").values_list("pk", "status")),
                    "address_suppressed": suppressed,
                    "can_resend": self.has_resend_permission(request) and delivery.status in RESENDABLE,
                    "can_cancel": self.has_cancel_permission(request) and delivery.status in CANCELLABLE,
                    "can_suppress": self.has_suppress_permission(request) and bool(delivery.address) and not suppressed,
                    "can_unsuppress": self.has_unsuppress_permission(request) and suppressed,
                }
            )
        return super().change_view(request, object_id, form_url, context)


# Campaign admin lives with the campaigns; importing it registers it.
import notifier.campaigns.admin  # noqa: E402

# So are the event endpoints and their attempts.
import notifier.statusevents.admin  # noqa: E402, F401
