"""Dead-letter endpoints: list, replay one, replay many, discard. Thin views over the services.

An API client sees and acts on the dead letters of its own notifications; operators see all of them in the
admin and with `manage.py replay_dead_letters`.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import ApiError
from core.pagination import CursorPage, invalid_cursor
from notifier.clients.auth import request_client
from notifier.deadletters.models import DeadLetter
from notifier.deadletters.selectors import dead_letter_get, dead_letter_list
from notifier.deadletters.serializers import (
    DeadLetterListInput,
    DeadLetterOutput,
    DeadLetterPage,
    ReplayInput,
    ReplayOutput,
)
from notifier.deadletters.services import (
    DeadLetterError,
    dead_letter_discard,
    dead_letter_replay,
    dead_letters_replay,
)


def _get_or_404(request: Request, dead_letter_id: int) -> DeadLetter:
    dead_letter = dead_letter_get(dead_letter_id=dead_letter_id, client=request_client(request))
    if dead_letter is None:
        raise ApiError(404, "not_found", "No such dead letter.")
    return dead_letter


def _conflict(exc: DeadLetterError) -> ApiError:
    return ApiError(409, exc.code, exc.message)


class DeadLetterListApi(APIView):
    """GET: the caller's dead letters, newest first (filters: channel, status; keyset cursor)."""

    required_scope = "operations"

    @extend_schema(
        operation_id="dead_letters_list",
        summary="List dead letters",
        parameters=[DeadLetterListInput],
        responses=DeadLetterPage,
    )
    def get(self, request: Request) -> Response:
        params = DeadLetterListInput(data=request.query_params)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        try:
            page, next_cursor = dead_letter_list(
                filters=data,
                cursor=request.query_params.get("cursor") or None,
                limit=data["limit"],
                client=request_client(request),
            )
        except ValueError:
            raise invalid_cursor() from None
        return Response(DeadLetterPage(CursorPage(page, next_cursor)).data)


class DeadLetterReplayApi(APIView):
    """POST: put one dead letter's delivery back on its queue."""

    required_scope = "operations"
    error_statuses = {409: "The dead letter is no longer pending."}

    @extend_schema(
        operation_id="dead_letter_replay", summary="Replay a dead letter", request=None, responses=DeadLetterOutput
    )
    def post(self, request: Request, dead_letter_id: int) -> Response:
        dead_letter = _get_or_404(request, dead_letter_id)
        try:
            dead_letter = dead_letter_replay(dead_letter=dead_letter, actor=request_client(request).name)
        except DeadLetterError as exc:
            raise _conflict(exc) from None
        return Response(DeadLetterOutput(dead_letter).data)


class DeadLetterBulkReplayApi(APIView):
    """POST {"ids": [...]} or {"all": true, "channel"?}: replay many; answers how many deliveries were re-queued."""

    required_scope = "operations"

    @extend_schema(
        operation_id="dead_letters_replay",
        summary="Replay many dead letters",
        request=ReplayInput,
        responses=ReplayOutput,
    )
    def post(self, request: Request) -> Response:
        params = ReplayInput(data=request.data)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        replayed = dead_letters_replay(
            ids=data.get("ids"),
            all=data["all"],
            channel=data.get("channel"),
            actor=request_client(request).name,
            client=request_client(request),
        )
        return Response(ReplayOutput({"replayed": replayed}).data)


class DeadLetterDiscardApi(APIView):
    """POST: give up on one dead letter (its delivery stays failed)."""

    required_scope = "operations"
    error_statuses = {409: "The dead letter is no longer pending."}

    @extend_schema(
        operation_id="dead_letter_discard", summary="Discard a dead letter", request=None, responses=DeadLetterOutput
    )
    def post(self, request: Request, dead_letter_id: int) -> Response:
        dead_letter = _get_or_404(request, dead_letter_id)
        try:
            dead_letter = dead_letter_discard(dead_letter=dead_letter, actor=request_client(request).name)
        except DeadLetterError as exc:
            raise _conflict(exc) from None
        return Response(DeadLetterOutput(dead_letter).data)
