"""GET /api/v1/sandbox/messages: what the sandbox providers recorded instead of sending."""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from channels_app.models import SandboxMessage
from notifier.errors import ApiError

PAGE = 100


class SandboxMessageListApi(APIView):
    """List sandbox messages, newest first, filtered by channel, address or delivery id, keyset-paginated."""

    required_scope = "operations"

    def get(self, request: Request) -> Response:
        qs = SandboxMessage.objects.all()
        params = request.query_params
        if params.get("channel"):
            qs = qs.filter(channel=params["channel"])
        if params.get("address"):
            qs = qs.filter(address=params["address"])
        try:
            if params.get("delivery_id"):
                qs = qs.filter(delivery_id=int(params["delivery_id"]))
            if params.get("cursor"):
                qs = qs.filter(id__lt=int(params["cursor"]))
        except ValueError:
            raise ApiError(400, "invalid", "delivery_id and cursor are integers.") from None
        page = list(qs.order_by("-id")[: PAGE + 1])
        next_cursor = str(page[PAGE - 1].pk) if len(page) > PAGE else None
        items = [
            {
                "id": m.pk,
                "delivery_id": m.delivery_id,
                "channel": m.channel,
                "provider": m.provider,
                "address": m.address,
                "content": m.content,
                "created_at": m.created_at,
            }
            for m in page[:PAGE]
        ]
        return Response({"results": items, "next_cursor": next_cursor})
