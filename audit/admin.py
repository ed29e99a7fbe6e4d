"""The audit log in the admin: read-only for everyone, superusers included."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Browse who changed what; nothing here can be added, edited or deleted."""

    list_display = ("at", "actor_type", "actor_name", "action", "target_type", "target_id")
    list_filter = ("actor_type", "action", "target_type")
    search_fields = ("target_id", "actor_name", "action")
    date_hierarchy = "at"
    readonly_fields = ("at", "actor_type", "actor_id", "actor_name", "action", "target_type", "target_id", "changes")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
