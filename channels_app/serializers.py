"""Input and output serializers of GET /api/v1/sandbox/messages."""

from __future__ import annotations

from rest_framework import serializers

from channels_app.models import SandboxMessage
from core.pagination import CursorQuerySerializer, cursor_page_serializer


class SandboxFilterSerializer(CursorQuerySerializer):
    """Query parameters of the sandbox outbox."""

    channel = serializers.CharField(required=False, allow_blank=True)
    address = serializers.CharField(required=False, allow_blank=True)
    delivery_id = serializers.IntegerField(required=False)


class SandboxMessageOutput(serializers.Serializer[SandboxMessage]):
    """A message a sandbox provider recorded instead of sending it."""

    id = serializers.IntegerField()
    delivery_id = serializers.IntegerField()
    channel = serializers.CharField()
    provider = serializers.CharField()
    address = serializers.CharField()
    content = serializers.JSONField(help_text="The rendered parts, as the provider would have sent them.")
    created_at = serializers.DateTimeField()


SandboxMessagePage = cursor_page_serializer(SandboxMessageOutput, name="SandboxMessagePage")
