"""GET /api/v1/sandbox/messages: what the sandbox providers recorded instead of sending."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from channels_app.models import SandboxMessage
from channels_app.serializers import SandboxFilterSerializer, SandboxMessagePage
from core.pagination import CursorPage, cursor_id

PAGE = 100


class SandboxMessageListApi(APIView):
    """List sandbox messages, newest first, filtered by channel, address or delivery id, keyset-paginated."""

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
        qs = SandboxMessage.objects.all()
        if q.get("channel"):
            qs = qs.filter(channel=q["channel"])
        if q.get("address"):
            qs = qs.filter(address=q["address"])
        if q.get("delivery_id"):
            qs = qs.filter(delivery_id=q["delivery_id"])
        before = cursor_id(q.get("cursor"))
        if before is not None:
            qs = qs.filter(id__lt=before)
        page = list(qs.order_by("-id")[: PAGE + 1])
        next_id = page[PAGE - 1].pk if len(page) > PAGE else None
        return Response(SandboxMessagePage(CursorPage(page[:PAGE], next_id)).data)
