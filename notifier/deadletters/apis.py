"""Dead-letter endpoints: list, replay one, replay many, discard. Thin views over the services.

An API client sees and acts on the dead letters of its own notifications; operators see all of them in the
admin and with `manage.py replay_dead_letters`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from notifier.auth import request_client
from notifier.deadletters.selectors import dead_letter_get, dead_letter_list
from notifier.deadletters.services import (
    DeadLetterError,
    dead_letter_discard,
    dead_letter_replay,
    dead_letters_replay,
)
from notifier.errors import ApiError
from notifier.models import DeadLetter

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


class DeadLetterListInput(serializers.Serializer):
    channel = serializers.ChoiceField(choices=settings.CHANNELS, required=False)
    status = serializers.ChoiceField(choices=DeadLetter.Status.values, required=False)
    cursor = serializers.CharField(required=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=500, default=50)


class ReplayInput(serializers.Serializer):
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1), required=False, allow_empty=False, max_length=MAX_IDS
    )
    all = serializers.BooleanField(required=False, default=False)
    channel = serializers.ChoiceField(choices=settings.CHANNELS, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("ids" in attrs) == bool(attrs.get("all")):
            raise serializers.ValidationError({"ids": ['Give either "ids" or "all": true.']})
        return attrs


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

    def get(self, request: Request) -> Response:
        params = DeadLetterListInput(data=request.query_params)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        try:
            page, next_cursor = dead_letter_list(
                filters=data, cursor=data.get("cursor"), limit=data["limit"], client=request_client(request)
            )
        except ValueError:
            raise ApiError(400, "invalid", "Invalid cursor.", {"cursor": ["Invalid cursor."]}) from None
        return Response({"results": DeadLetterOutput(page, many=True).data, "next_cursor": next_cursor})


class DeadLetterReplayApi(APIView):
    """POST: put one dead letter's delivery back on its queue."""

    required_scope = "operations"

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
        return Response({"replayed": replayed})


class DeadLetterDiscardApi(APIView):
    """POST: give up on one dead letter (its delivery stays failed)."""

    required_scope = "operations"

    def post(self, request: Request, dead_letter_id: int) -> Response:
        dead_letter = _get_or_404(request, dead_letter_id)
        try:
            dead_letter = dead_letter_discard(dead_letter=dead_letter, actor=request_client(request).name)
        except DeadLetterError as exc:
            raise _conflict(exc) from None
        return Response(DeadLetterOutput(dead_letter).data)
