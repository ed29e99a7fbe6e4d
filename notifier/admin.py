"""Admin for support staff and operators: API clients, notifications, deliveries with their history."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from notifier.deadletters.admin import DeadLetterAdmin
from notifier.models import ApiClient, DeadLetter, Delivery, DeliveryEvent, FanoutLane, Notification

admin.site.register(DeadLetter, DeadLetterAdmin)


class ReadOnlyAdmin(admin.ModelAdmin):
    """An admin that can look but not touch: history is written only by the pipeline."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ApiClient)
class ApiClientAdmin(admin.ModelAdmin):
    """Calling services. Keys are created with `create_api_client`; only their hash is stored."""

    list_display = ("name", "key_prefix", "allowed_categories", "is_active", "created_at", "last_used_at")
    list_filter = ("is_active",)
    search_fields = ("name", "key_prefix")
    readonly_fields = ("key_prefix", "key_hash", "created_at", "last_used_at")


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
