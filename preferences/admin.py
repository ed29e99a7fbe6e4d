"""Admin for recipients (with devices), topics and the suppression list; list pages show no personal data."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from audit.admin import AuditedAdminMixin
from preferences.models import Device, Recipient, Suppression, Topic
from preferences.phones import InvalidPhoneNumber, phone_normalize
from projects.admin import OwnedAdmin


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
