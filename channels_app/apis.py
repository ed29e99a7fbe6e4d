"""GET /api/v1/sandbox/messages: what the sandbox providers recorded instead of sending.

A client lists the messages of its own notifications only (they carry OTPs and signed preference and
unsubscribe links), like its dead letters; staff see every client's in the admin.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from channels_app.models import SandboxMessage
from channels_app.serializers import SandboxFilterSerializer, SandboxMessagePage
from core.pagination import CursorPage, cursor_id
from notifier.clients.auth import request_client


class SandboxMessageListApi(APIView):
    """List the client's sandbox messages, newest first, filtered by channel, address or delivery id (keyset pages)."""

    required_scope = "operations"

    @extend_schema(
        operation_id="sandbox_messages_list",
        summary="List sandbox messages",
        parameters=[SandboxFilterSerializer],
        responses=SandboxMessagePage,
    )
    def get(self, request: Request) -> Response:
        params = SandboxFilterSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        q = params.validated_data
        # Served by sandbox_client_id_idx (client_id, id): the keyset page stays an index range scan.
        qs = SandboxMessage.objects.filter(client_id=request_client(request).pk)
        if q.get("channel"):
            qs = qs.filter(channel=q["channel"])
        if q.get("address"):
            qs = qs.filter(address=q["address"])
        if q.get("delivery_id"):
            qs = qs.filter(delivery_id=q["delivery_id"])
        before = cursor_id(q.get("cursor"))
        if before is not None:
            qs = qs.filter(id__lt=before)
        limit = q["limit"]
        page = list(qs.order_by("-id")[: limit + 1])
        next_id = page[limit - 1].pk if len(page) > limit else None
        return Response(SandboxMessagePage(CursorPage(page[:limit], next_id)).data)
