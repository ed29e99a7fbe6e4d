"""REST endpoints for notifications (docs/api.md, "Notifications"). Thin: validate, call a service, render.

Bodies and answers are the serializers of notifier/accepting/serializers.py; errors go through core.errors.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.bodies import ItemsJSONParser, item_problems, values_to_check
from core.errors import ApiError
from core.openapi import error_response
from core.pagination import CursorPage, invalid_cursor
from core.serializers import thread_serializer
from notifier.accepting.backpressure import check_backpressure
from notifier.accepting.send_kinds import send_kind_of_notification, send_kind_of_request
from notifier.accepting.serializers import (
    AcceptOutput,
    BatchInput,
    BatchOutput,
    CancelOutput,
    NotificationDetailOutput,
    NotificationFilterSerializer,
    NotificationInput,
    NotificationPage,
    NotificationWorkflowOutput,
    StatsOutput,
    StatsQuerySerializer,
    accept_answer,
    send_input,
    send_input_fast,
)
from notifier.accepting.services import notification_accept_grouped, notification_cancel, notifications_accept_batch
from notifier.clients.auth import request_client, require_scope
from notifier.deliveries.models import Notification
from notifier.deliveries.selectors import (
    delivery_stats,
    notification_delivery_counts,
    notification_get,
    notification_list,
)
from projects.scoping import owner_id
from templates_app.selectors import TemplateNotFound, template_version_cached

SEND_EXAMPLE = {
    "recipient": {"user_id": "u-42"},
    "template": "order_shipped",
    "channels": ["push", "email"],
    "payload": {"order_id": "A-1001"},
    "dedup_key": "order-A-1001-shipped",
    "priority": "high",
}
ACCEPTED_EXAMPLE = {
    "id": "5b0f2f7e-3c1e-4b8e-9a57-0c1d2e3f4a5b",
    "status": "accepted",
    "duplicate": False,
    "deliveries": [
        {"id": 1201, "channel": "push", "status": "queued", "reason": ""},
        {"id": 1202, "channel": "email", "status": "suppressed", "reason": "opted_out"},
    ],
}


def trace_id_of(request: Request) -> str:
    """Return the W3C trace id of the request (set by the request middleware), or ""."""
    return getattr(request._request, "trace_id", "") or ""


class NotificationListCreateApi(APIView):
    """POST: accept a notification. GET: list the client's notifications."""

    required_scope = "send"

    @extend_schema(
        operation_id="notifications_send",
        summary="Send a notification",
        description="Accept a notification for one recipient or a topic: 202 when new, 200 with "
        '`"duplicate": true` when the same `dedup_key` was sent before (409 if its body differs).',
        request=NotificationInput,
        responses={
            202: OpenApiResponse(AcceptOutput, description="Accepted."),
            200: OpenApiResponse(AcceptOutput, description="A duplicate of an earlier request (same dedup_key)."),
            409: error_response(409, "The dedup_key was used before with a different body."),
        },
        examples=[
            OpenApiExample("To a user", value=SEND_EXAMPLE, request_only=True),
            OpenApiExample(
                "To a topic",
                value={"topic": "all-users", "template": "spring_sale", "send_at_local": "2026-12-01T09:00:00"},
                request_only=True,
            ),
            OpenApiExample("Accepted", value=ACCEPTED_EXAMPLE, response_only=True, status_codes=["202"]),
            OpenApiExample(
                "Duplicate", value={**ACCEPTED_EXAMPLE, "duplicate": True}, response_only=True, status_codes=["200"]
            ),
        ],
    )
    def post(self, request: Request) -> Response:
        data = send_input(request.data)
        _require_topics_scope(request, data)
        _shed_if_overloaded(request, data)
        kind = send_kind_of_request(data)
        accept = kind.accept if kind is not None else notification_accept_grouped
        result = accept(client=request_client(request), data=data, trace_id=trace_id_of(request))
        code = status.HTTP_200_OK if result.duplicate else status.HTTP_202_ACCEPTED
        return Response({**accept_answer(result), **_workflow_of(result.notification)}, status=code)

    @extend_schema(
        operation_id="notifications_list",
        summary="List notifications",
        parameters=[NotificationFilterSerializer],
        responses={200: NotificationPage},
    )
    def get(self, request: Request) -> Response:
        params = NotificationFilterSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        filters = {k: params.validated_data.get(k) for k in ("user_id", "status", "category")}
        try:
            page, next_cursor = notification_list(
                client=request_client(request),
                filters=filters,
                cursor=request.query_params.get("cursor") or None,
                limit=params.validated_data["limit"],
            )
        except ValueError:
            raise invalid_cursor() from None
        return Response(NotificationPage(CursorPage(page, next_cursor)).data)


def _workflow_of(notification: Notification) -> dict[str, Any]:
    """Return what a notification sent with `workflow` adds to its answers (nothing for any other)."""
    kind = send_kind_of_notification(notification)
    found = kind.describe(notification) if kind is not None else None
    return dict(NotificationWorkflowOutput(found).data) if found else {}


def _require_topics_scope(request: Request, data: dict[str, Any]) -> None:
    """Refuse a topic send from a key without the `topics` scope: one request would reach every subscriber."""
    if data.get("topic"):
        require_scope(request_client(request), "topics", field="topic", why="sending to a topic")


def _shed_if_overloaded(request: Request, data: dict[str, Any]) -> None:
    """Answer 429 to low-priority requests while the low-priority backlog is too deep (see backpressure)."""
    category = data.get("category")
    if not category and data.get("priority") != "high" and data.get("template"):
        try:
            # The per-process cache the accept reads too (notifier/lookup_cache.py): no query per request.
            version = template_version_cached(data["template"], environment_id=owner_id(request_client(request)))
            category = version.template.category
        except TemplateNotFound:
            return  # accepting answers the 400
    check_backpressure(category=category or "", priority=data.get("priority"))


class NotificationBatchApi(APIView):
    """Accept up to 1,000 notifications in one call; one result (or error) per item, in order.

    Items are validated one by one (a bad item is its own 400), then accepted together: one statement per
    table and one publish for the whole batch (notifier.accepting.services.notifications_accept_batch).
    """

    required_scope = "send"
    # Nesting and text PostgreSQL cannot store are checked per item (`_validate`): a bad item fails alone.
    parser_classes = [ItemsJSONParser]

    @extend_schema(
        operation_id="notifications_send_batch",
        summary="Send up to 1,000 notifications",
        description="Each item is validated and accepted as by the single send; the answer has one result per "
        "item, in order, with the HTTP `status` that item would have had alone (202, 200 for a duplicate, or "
        "the error).",
        request=BatchInput,
        responses={200: BatchOutput},
        examples=[
            OpenApiExample(
                "Two sends",
                value={
                    "notifications": [
                        SEND_EXAMPLE,
                        {"recipient": {"user_id": "u-43"}, "template": "no_such_template"},
                    ]
                },
                request_only=True,
            ),
            OpenApiExample(
                "One accepted, one refused",
                value={
                    "results": [
                        {**ACCEPTED_EXAMPLE, "status": 202},
                        {
                            "error": {
                                "code": "invalid",
                                "message": "unknown template 'no_such_template'",
                                "fields": {"template": ["unknown template 'no_such_template'"]},
                            },
                            "status": 400,
                        },
                    ]
                },
                response_only=True,
                status_codes=["200"],
            ),
        ],
    )
    def post(self, request: Request) -> Response:
        # A bare list is accepted too (as it always was), as the body's `notifications`.
        body = BatchInput(data={"notifications": request.data} if isinstance(request.data, list) else request.data)
        body.is_valid(raise_exception=True)
        items = body.validated_data["notifications"]
        # One serializer instance for every item: DRF deep-copies its declared fields per instance, which was
        # most of a batch's validation time.
        validator = thread_serializer(NotificationInput)
        checked = [self._validate(request, validator, item) for item in items]
        valid = [
            (i, data)
            for i, data in enumerate(checked)
            if not isinstance(data, Exception) and send_kind_of_request(data) is None
        ]
        accepted = notifications_accept_batch(
            client=request_client(request), items=[data for _, data in valid], trace_id=trace_id_of(request)
        )
        results: list[Any] = list(checked)
        for (index, _), result in zip(valid, accepted, strict=True):
            results[index] = result
        for index, data in enumerate(checked):
            kind = None if isinstance(data, Exception) else send_kind_of_request(data)
            if kind is not None:
                # Each such item on its own (a workflow: a user's run, or a topic's fan-out), failing alone.
                try:
                    results[index] = kind.accept(
                        client=request_client(request), data=data, trace_id=trace_id_of(request)
                    )
                except ApiError as exc:
                    results[index] = exc
        return Response(BatchOutput({"results": results}).data, status=status.HTTP_200_OK)

    @staticmethod
    def _validate(
        request: Request, validator: NotificationInput, item: Any
    ) -> dict[str, Any] | serializers.ValidationError | ApiError:
        refused = item_problems(item, check_values=values_to_check(request))
        if refused is not None:
            return refused
        try:
            data = send_input_fast(item)
            if data is None:
                data = validator.run_validation(item)
            _require_topics_scope(request, data)  # a topic item without the scope fails alone
            _shed_if_overloaded(request, data)
        except (serializers.ValidationError, ApiError) as exc:
            return exc
        except DjangoValidationError as exc:
            return serializers.ValidationError(detail=serializers.as_serializer_error(exc))
        return dict(data)


def _notification_or_404(notification: Notification | None) -> Notification:
    if notification is None:
        raise ApiError(404, "not_found", "No such notification.")
    return notification


class NotificationDetailApi(APIView):
    """GET one notification with its deliveries and their event history."""

    required_scope = "send"

    @extend_schema(operation_id="notification_get", summary="Read a notification", responses=NotificationDetailOutput)
    def get(self, request: Request, notification_id: str) -> Response:
        notification = _notification_or_404(
            notification_get(client=request_client(request), notification_id=str(notification_id))
        )
        counts = notification_delivery_counts(notification=notification)
        body = NotificationDetailOutput(notification, context={"delivery_counts": counts}).data
        return Response({**body, **_workflow_of(notification)})


class NotificationCancelApi(APIView):
    """Cancel the deliveries of a notification that are not yet sent."""

    required_scope = "send"

    @extend_schema(
        operation_id="notification_cancel",
        summary="Cancel what is not yet sent",
        request=None,
        responses=CancelOutput,
    )
    def post(self, request: Request, notification_id: str) -> Response:
        notification = _notification_or_404(
            Notification.objects.filter(client=request_client(request), pk=notification_id).first()
        )
        kind = send_kind_of_notification(notification)
        if kind is not None:
            cancelled = kind.cancel(notification)  # a workflow's runs stopped
        else:
            cancelled = notification_cancel(notification=notification)
        return Response(CancelOutput({"notification": notification, "cancelled": cancelled}).data)


class StatsApi(APIView):
    """GET /stats: counts of deliveries per day, channel, status, template and key, from the delivery log.

    The calling key's own (`scope=client`, the default) or its project environment's (`scope=project`).
    """

    required_scope = "send"

    @extend_schema(
        operation_id="stats_get",
        summary="Delivery statistics",
        parameters=[StatsQuerySerializer],
        responses={
            200: StatsOutput,
            400: error_response(400, "Invalid from, to, group_by, scope or mode, or archived days."),
        },
    )
    def get(self, request: Request) -> Response:
        params = StatsQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        q = params.validated_data
        client = request_client(request)
        # A notification's mode is its client's: another mode than the caller's has nothing to count.
        wrong_mode = q.get("mode") and q["mode"] != client.mode
        rows = (
            []
            if wrong_mode
            else delivery_stats(client=client, first=q["from"], last=q["to"], group_by=q["group_by"], scope=q["scope"])
        )
        return Response(StatsOutput({"results": rows, "from": q["from"], "to": q["to"]}).data)
