"""In-app inbox endpoints (API key authenticated, like every /api/v1 call)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import ApiError
from core.pagination import CursorPage, cursor_id
from core.scopes import RECIPIENT_SCOPES
from notifier.inbox.selectors import inbox_list, inbox_recipient_get, inbox_unread_count
from notifier.inbox.serializers import InboxItemSerializer, InboxPage, InboxQuerySerializer, InboxReadAllOutput
from notifier.inbox.services import inbox_item_archive, inbox_item_click, inbox_item_mark_read, inbox_mark_all_read
from preferences.models import Recipient


def _recipient_or_404(user_id: str) -> Recipient:
    recipient = inbox_recipient_get(user_id=user_id)
    if recipient is None:
        raise ApiError(404, "not_found", "Unknown recipient.")
    return recipient


class InboxListApi(APIView):
    """List a recipient's inbox, newest first, with keyset pagination and the unread count."""

    required_scopes = RECIPIENT_SCOPES

    @extend_schema(
        operation_id="inbox_list", summary="List an inbox", parameters=[InboxQuerySerializer], responses=InboxPage
    )
    def get(self, request: Request, user_id: str) -> Response:
        params = InboxQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        before = cursor_id(params.validated_data.get("cursor"))
        recipient = _recipient_or_404(user_id)
        items, next_id = inbox_list(
            recipient=recipient,
            unread_only=params.validated_data["unread"],
            archived=params.validated_data["archived"],
            before_id=before,
            limit=params.validated_data["limit"],
        )
        page = CursorPage(items, next_id, extra={"unread_count": inbox_unread_count(recipient=recipient)})
        return Response(InboxPage(page).data)


class InboxItemReadApi(APIView):
    """Mark one inbox item read; its delivery moves to `opened`."""

    required_scopes = RECIPIENT_SCOPES

    @extend_schema(
        operation_id="inbox_item_read", summary="Mark an inbox item read", request=None, responses=InboxItemSerializer
    )
    def post(self, request: Request, user_id: str, delivery_id: int) -> Response:
        recipient = _recipient_or_404(user_id)
        item = inbox_item_mark_read(recipient=recipient, delivery_id=delivery_id)
        if item is None:
            raise ApiError(404, "not_found", "Unknown inbox item.")
        return Response(InboxItemSerializer(item).data)


class InboxReadAllApi(APIView):
    """Mark every unread inbox item of a recipient read."""

    required_scopes = RECIPIENT_SCOPES

    @extend_schema(
        operation_id="inbox_read_all", summary="Mark a whole inbox read", request=None, responses=InboxReadAllOutput
    )
    def post(self, request: Request, user_id: str) -> Response:
        recipient = _recipient_or_404(user_id)
        marked = inbox_mark_all_read(recipient=recipient)
        data = {"marked_read": marked, "unread_count": inbox_unread_count(recipient=recipient)}
        return Response(InboxReadAllOutput(data).data)


class InboxItemArchiveApi(APIView):
    """Archive one inbox item: it is marked read and leaves the default list (`archived=true` lists it)."""

    required_scopes = RECIPIENT_SCOPES
    archived = True

    @extend_schema(
        operation_id="inbox_item_archive", summary="Archive an inbox item", request=None, responses=InboxItemSerializer
    )
    def post(self, request: Request, user_id: str, delivery_id: int) -> Response:
        recipient = _recipient_or_404(user_id)
        item = inbox_item_archive(recipient=recipient, delivery_id=delivery_id, archived=self.archived)
        if item is None:
            raise ApiError(404, "not_found", "Unknown inbox item.")
        return Response(InboxItemSerializer(item).data)


class InboxItemUnarchiveApi(InboxItemArchiveApi):
    """Bring an archived inbox item back to the default list (it stays read)."""

    archived = False

    @extend_schema(
        operation_id="inbox_item_unarchive",
        summary="Unarchive an inbox item",
        request=None,
        responses=InboxItemSerializer,
    )
    def post(self, request: Request, user_id: str, delivery_id: int) -> Response:
        return super().post(request, user_id=user_id, delivery_id=delivery_id)


class InboxItemClickApi(APIView):
    """Count a click on an inbox item's action URL (a `clicked` event) and mark the item read."""

    required_scopes = RECIPIENT_SCOPES

    @extend_schema(
        operation_id="inbox_item_click",
        summary="Record a click on an inbox item",
        request=None,
        responses=InboxItemSerializer,
    )
    def post(self, request: Request, user_id: str, delivery_id: int) -> Response:
        recipient = _recipient_or_404(user_id)
        item = inbox_item_click(recipient=recipient, delivery_id=delivery_id)
        if item is None:
            raise ApiError(404, "not_found", "Unknown inbox item.")
        return Response(InboxItemSerializer(item).data)
