"""Admin of dead letters: filter, inspect, replay or discard (registered by notifier.staff.admin)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from notifier.deadletters.models import DeadLetter
from notifier.deadletters.services import dead_letters_discard, dead_letters_replay
from projects.admin import OwnedAdmin


@admin.register(DeadLetter)
class DeadLetterAdmin(OwnedAdmin):
    """Deliveries that exhausted their attempts: the operator's work list."""

    list_display = ("id", "delivery", "channel", "queue", "reason", "attempts", "status", "created_at", "resolved_by")
    list_filter = ("status", "channel", "reason", "queue", "created_at")
    search_fields = ("=id", "=delivery__id", "=delivery__notification__id")
    list_select_related = ("delivery",)
    raw_id_fields = ("delivery",)
    readonly_fields = (
        "delivery", "channel", "queue", "reason", "attempts", "last_error", "status", "resolved_by",
        "resolved_at", "created_at",
    )  # fmt: skip
    ordering = ("-id",)
    show_full_result_count = False
    actions = ("replay_selected", "discard_selected")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Resolved through replay or discard, so the record of what happened stays.
        return False

    @admin.action(description="Replay selected dead letters", permissions=["change"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        replayed = dead_letters_replay(ids=ids, actor=request.user.get_username())
        skipped = len(ids) - replayed
        self.message_user(request, f"{replayed} replayed.", messages.SUCCESS)
        if skipped > 0:
            self.message_user(
                request,
                f"{skipped} not replayed: already resolved, or their delivery is no longer failed.",
                messages.WARNING,
            )

    @admin.action(description="Discard selected dead letters", permissions=["change"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> None:
        discarded = dead_letters_discard(queryset=queryset, actor=request.user.get_username())
        self.message_user(request, f"{discarded} discarded.", messages.SUCCESS)
