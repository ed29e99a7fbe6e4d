"""Input and output serializers of the dead-letter API."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from core.pagination import CursorQuerySerializer, PageLimitField, cursor_page_serializer
from notifier.deadletters.models import DeadLetter

MAX_IDS = 10_000


class DeadLetterOutput(serializers.ModelSerializer):
    """A dead letter with its delivery's current status."""

    delivery_id = serializers.IntegerField()
    notification_id = serializers.UUIDField(source="delivery.notification_id")
    delivery_status = serializers.CharField(source="delivery.status")

    class Meta:
        model = DeadLetter
        fields = [
            "id", "delivery_id", "notification_id", "delivery_status", "channel", "queue", "reason", "attempts",
            "last_error", "status", "resolved_by", "resolved_at", "created_at",
        ]  # fmt: skip


class DeadLetterListInput(CursorQuerySerializer):
    """Query parameters of the dead-letter list."""

    channel = serializers.ChoiceField(choices=settings.CHANNELS, required=False)
    status = serializers.ChoiceField(choices=DeadLetter.Status.values, required=False)
    # Up to 500 a page, as this list allowed before every list took the same `limit`.
    limit = PageLimitField(max_value=500)


class ReplayInput(serializers.Serializer):
    """The body of POST /api/v1/dead-letters/replay: some ids, or all (optionally of one channel)."""

    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1), required=False, allow_empty=False, max_length=MAX_IDS
    )
    all = serializers.BooleanField(required=False, default=False)
    channel = serializers.ChoiceField(choices=settings.CHANNELS, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("ids" in attrs) == bool(attrs.get("all")):
            raise serializers.ValidationError({"ids": ['Give either "ids" or "all": true.']})
        return attrs


class ReplayOutput(serializers.Serializer):
    """How many deliveries a bulk replay re-queued."""

    replayed = serializers.IntegerField()


DeadLetterPage = cursor_page_serializer(DeadLetterOutput, name="DeadLetterPage")
