"""Input and output serializers of the event-endpoint API (docs/api.md)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from rest_framework import serializers
from rest_framework.fields import SkipField

from core.pagination import CursorQuerySerializer, cursor_page_serializer
from core.ssrf import url_refusal
from notifier.statusevents.models import EventAttempt, EventEndpoint
from notifier.statusevents.record import EVENT_STATUSES

EVENT_TYPES = [f"delivery.{s}" for s in EVENT_STATUSES]


class EventEndpointInput(serializers.Serializer):
    """The body of PUT /api/v1/event-endpoint."""

    url = serializers.URLField(max_length=2048)
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=EVENT_TYPES), required=False, allow_empty=False, default=EVENT_TYPES
    )
    max_batch = serializers.IntegerField(min_value=1, max_value=settings.EVENT_MAX_BATCH, default=1)

    def validate_url(self, value: str) -> str:
        if urlsplit(value).scheme not in ("http", "https"):
            raise serializers.ValidationError("Only http and https URLs.")
        # A literal address is judged now; a name is resolved and checked on every request by the sender.
        reason = url_refusal(value, allow_private=settings.WEBHOOK_ALLOW_PRIVATE_TARGETS)
        if reason:
            raise serializers.ValidationError(f"This address is not allowed as a target ({reason}).")
        return value


class _ShownSecretField(serializers.CharField):
    """The secret passed in the serializer's context, left out when there is none (never the stored one).

    Not read-only, so the schema does not list it as always present (drf-spectacular requires read-only fields).
    """

    def get_attribute(self, instance: Any) -> Any:
        secret = self.context.get("secret")
        if not secret:
            raise SkipField
        return secret


class EventEndpointOutput(serializers.Serializer):
    """An event endpoint; `secret` only right after creation or rotation (pass it in the context)."""

    url = serializers.URLField()
    events = serializers.SerializerMethodField()
    max_batch = serializers.IntegerField()
    is_active = serializers.BooleanField()
    failures = serializers.IntegerField()
    retry_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    secret = _ShownSecretField(required=False, help_text="The signing secret: shown on creation and rotation only.")

    def get_events(self, obj: EventEndpoint) -> list[str]:
        return [f"delivery.{s}" for s in obj.statuses]


class EventAttemptsQuery(CursorQuerySerializer):
    """Query parameters of the attempts list."""


class EventAttemptSerializer(serializers.Serializer):
    """One POST to the endpoint: how it went and which events it carried."""

    id = serializers.IntegerField()
    at = serializers.DateTimeField()
    ok = serializers.BooleanField()
    status_code = serializers.IntegerField(allow_null=True)
    error = serializers.CharField()
    events = serializers.IntegerField()
    first_event_id = serializers.SerializerMethodField()
    last_event_id = serializers.SerializerMethodField()
    given_up = serializers.IntegerField()
    duration_ms = serializers.IntegerField()

    def get_first_event_id(self, obj: EventAttempt) -> str:
        return f"evt_{obj.first_event_id}"

    def get_last_event_id(self, obj: EventAttempt) -> str:
        return f"evt_{obj.last_event_id}"


EventAttemptPage = cursor_page_serializer(EventAttemptSerializer, name="EventAttemptPage", items_key="items")
