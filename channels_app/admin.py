"""Admin: what the sandbox providers recorded."""

from __future__ import annotations

from django.contrib import admin

from channels_app.models import SandboxMessage
from notifier.staff.admin import ReadOnlyAdmin
from projects.admin import OwnedAdmin


@admin.register(SandboxMessage)
class SandboxMessageAdmin(OwnedAdmin, ReadOnlyAdmin):
    """Messages the sandbox "sent": how a newcomer sees the pipeline work without provider accounts."""

    list_display = ("id", "delivery_id", "channel", "provider", "created_at")
    list_filter = ("channel", "provider")
    search_fields = ("=delivery_id",)
    show_full_result_count = False
