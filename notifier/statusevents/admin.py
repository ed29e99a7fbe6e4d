"""Admin of event endpoints: where each client's status events go, and every attempt to send them."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from notifier.statusevents.models import EventAttempt, EventEndpoint
from projects.admin import OwnedAdmin


class EventAttemptInline(admin.TabularInline):
    """The endpoint's latest attempts (read-only)."""

    model = EventAttempt
    fields = (
        "at",
        "ok",
        "status_code",
        "events",
        "first_event_id",
        "last_event_id",
        "given_up",
        "error",
        "duration_ms",
    )
    readonly_fields = fields
    ordering = ("-id",)
    extra = 0
    max_num = 0
    can_delete = False

    def get_queryset(self, request: HttpRequest) -> Any:
        # The newest fifty: an endpoint that failed for a day has thousands.
        ids = list(super().get_queryset(request).order_by("-id").values_list("id", flat=True)[:50])
        return EventAttempt.objects.filter(pk__in=ids).order_by("-id")


@admin.register(EventEndpoint)
class EventEndpointAdmin(OwnedAdmin):
    """Event endpoints; the secret is never shown (the client sees it once, over the API)."""

    list_display = ("client", "url", "max_batch", "is_active", "failures", "retry_at", "updated_at")
    list_filter = ("is_active",)
    search_fields = ("client__name", "url")
    exclude = ("secret",)
    readonly_fields = ("client", "failures", "retry_at", "created_at", "updated_at")
    inlines = (EventAttemptInline,)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # created by the client over the API, which shows it the secret


@admin.register(EventAttempt)
class EventAttemptAdmin(OwnedAdmin):
    """Every POST to an event endpoint and every give-up, searchable by client."""

    list_display = ("id", "endpoint", "at", "ok", "status_code", "events", "given_up", "error", "duration_ms")
    list_filter = ("ok",)
    search_fields = ("endpoint__client__name",)
    list_select_related = ("endpoint__client",)
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
