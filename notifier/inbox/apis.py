"""In-app inbox endpoints (API key authenticated, like every /api/v1 call)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from notifier.errors import ApiError
from notifier.inbox.selectors import inbox_list, inbox_recipient_get, inbox_unread_count
from notifier.inbox.services import inbox_item_mark_read, inbox_mark_all_read
from notifier.models import Delivery
from notifier.scopes import RECIPIENT_SCOPES
from preferences.models import Recipient


class InboxItemSerializer(serializers.Serializer):
    """One inbox item: the in-app delivery and its rendered title and body."""

    id = serializers.IntegerField()
    notification_id = serializers.UUIDField()
    title = serializers.SerializerMethodField()
    body = serializers.SerializerMethodField()
    category = serializers.CharField(source="notification.category")
    status = serializers.CharField()
    created_at = serializers.DateTimeField()
    read_at = serializers.DateTimeField(allow_null=True)

    def get_title(self, obj: Delivery) -> str:
        return str((obj.content or {}).get("title", ""))

    def get_body(self, obj: Delivery) -> str:
        return str((obj.content or {}).get("body", ""))


def _recipient_or_404(user_id: str) -> Recipient:
    recipient = inbox_recipient_get(user_id=user_id)
    if recipient is None:
        raise ApiError(404, "not_found", "Unknown recipient.")
    return recipient


class InboxListApi(APIView):
    """List a recipient's inbox, newest first, with keyset pagination and the unread count."""

    required_scopes = RECIPIENT_SCOPES

    class InputSerializer(serializers.Serializer):
        unread = serializers.BooleanField(required=False, default=False)
        cursor = serializers.RegexField(r"^[1-9][0-9]{0,18}$", required=False, allow_blank=True)
        limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=20)

    class OutputSerializer(serializers.Serializer):
        items = InboxItemSerializer(many=True)
        next_cursor = serializers.CharField(allow_null=True)
        unread_count = serializers.IntegerField()

        class Meta:
            ref_name = "InboxPage"

    @extend_schema(parameters=[InputSerializer], responses=OutputSerializer)
    def get(self, request: Request, user_id: str) -> Response:
        params = self.InputSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        recipient = _recipient_or_404(user_id)
        cursor = params.validated_data.get("cursor")
        items, next_id = inbox_list(
            recipient=recipient,
            unread_only=params.validated_data["unread"],
            before_id=int(cursor) if cursor else None,
            limit=params.validated_data["limit"],
        )
        data: dict[str, Any] = {
            "items": items,
            "next_cursor": str(next_id) if next_id is not None else None,
            "unread_count": inbox_unread_count(recipient=recipient),
        }
        return Response(self.OutputSerializer(data).data)


class InboxItemReadApi(APIView):
    """Mark one inbox item read; its delivery moves to `opened`."""

    required_scopes = RECIPIENT_SCOPES

    @extend_schema(request=None, responses=InboxItemSerializer)
    def post(self, request: Request, user_id: str, delivery_id: int) -> Response:
        recipient = _recipient_or_404(user_id)
        item = inbox_item_mark_read(recipient=recipient, delivery_id=delivery_id)
        if item is None:
            raise ApiError(404, "not_found", "Unknown inbox item.")
        return Response(InboxItemSerializer(item).data)


class InboxReadAllApi(APIView):
    """Mark every unread inbox item of a recipient read."""

    required_scopes = RECIPIENT_SCOPES

    class OutputSerializer(serializers.Serializer):
        marked_read = serializers.IntegerField()
        unread_count = serializers.IntegerField()

        class Meta:
            ref_name = "InboxReadAll"

    @extend_schema(request=None, responses=OutputSerializer)
    def post(self, request: Request, user_id: str) -> Response:
        recipient = _recipient_or_404(user_id)
        marked = inbox_mark_all_read(recipient=recipient)
        data = {"marked_read": marked, "unread_count": inbox_unread_count(recipient=recipient)}
        return Response(self.OutputSerializer(data).data)
