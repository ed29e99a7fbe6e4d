"""Input and output serializers of the in-app inbox API (/api/v1 and /inbox/v1)."""

from __future__ import annotations

from django.conf import settings
from rest_framework import serializers

from core.pagination import CursorQuerySerializer, cursor_page_serializer
from notifier.deliveries.models import Delivery
from notifier.inbox.selectors import inbox_item_url


class InboxItemSerializer(serializers.Serializer):
    """One inbox item: the in-app delivery, its rendered title, body and action URL, read and archived times."""

    id = serializers.IntegerField()
    notification_id = serializers.UUIDField()
    title = serializers.SerializerMethodField()
    body = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField(help_text='The action URL (the template\'s `inapp.url`, http(s)), or "".')
    category = serializers.CharField(source="notification.category")
    status = serializers.CharField()
    created_at = serializers.DateTimeField()
    read_at = serializers.DateTimeField(allow_null=True)
    archived_at = serializers.DateTimeField(allow_null=True)

    def get_title(self, obj: Delivery) -> str:
        return str((obj.content or {}).get("title", ""))

    def get_body(self, obj: Delivery) -> str:
        return str((obj.content or {}).get("body", ""))

    def get_url(self, obj: Delivery) -> str:
        return inbox_item_url(obj)


class InboxQuerySerializer(CursorQuerySerializer):
    """Query parameters of an inbox page."""

    unread = serializers.BooleanField(required=False, default=False, help_text="Only unread items.")
    archived = serializers.BooleanField(
        required=False, default=False, help_text="Only archived items (without it, archived items are left out)."
    )


InboxPage = cursor_page_serializer(
    InboxItemSerializer,
    name="InboxPage",
    items_key="items",
    unread_count=serializers.IntegerField(help_text="Unread items in the whole inbox."),
)


class InboxReadAllOutput(serializers.Serializer):
    """How many items a read-all marked, and what is left unread."""

    marked_read = serializers.IntegerField()
    unread_count = serializers.IntegerField()


class InboxMeOutput(serializers.Serializer):
    """Who the inbox token speaks for, in which language, and a link to their preference center."""

    user_id = serializers.CharField()
    locale = serializers.CharField(help_text="The recipient's locale (\"\" when unknown): the widget's language.")
    preferences_url = serializers.CharField(help_text="A signed link to the recipient's preference center.")
    preferences_expires_at = serializers.DateTimeField()


class InboxTokenInput(serializers.Serializer):
    """How long an inbox token stays valid."""

    ttl_seconds = serializers.IntegerField(
        min_value=60,
        max_value=settings.INBOX_TOKEN_MAX_TTL_SECONDS,
        default=settings.INBOX_TOKEN_DEFAULT_TTL_SECONDS,
    )


class InboxTokenOutput(serializers.Serializer):
    """A short-lived token for one user's inbox, for the calling service to hand to its front end."""

    token = serializers.CharField()
    expires_at = serializers.DateTimeField()
