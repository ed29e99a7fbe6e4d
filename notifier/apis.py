"""REST endpoints for notifications and the sandbox outbox (API.md). Thin: validate, call a service, render."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from notifier.auth import request_client
from notifier.errors import ApiError, error_body
from notifier.localtime import parse_wall_clock
from notifier.models import Delivery, Notification
from notifier.selectors import (
    notification_delivery_counts,
    notification_get,
    notification_list,
)
from notifier.services import AcceptResult, notification_accept, notification_cancel, notifications_accept_batch
from notifier.strategy import MAX_AFTER_SECONDS, STRATEGIES
from notifier.strategy import UNTIL as FALLBACK_UNTIL

TEMPLATE_SPEC = re.compile(r"^[-a-zA-Z0-9_]+(@[1-9][0-9]*)?$")
LOCALE = re.compile(r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*$")
BATCH_LIMIT = 1000


class RecipientInput(serializers.Serializer):
    """The single recipient of a notification."""

    user_id = serializers.CharField(max_length=255)


class NotificationInput(serializers.Serializer):
    """The body of POST /api/v1/notifications."""

    recipient = RecipientInput(required=False)
    topic = serializers.SlugField(max_length=128, required=False)
    category = serializers.CharField(max_length=64, required=False)  # default: the template's
    template = serializers.CharField(max_length=140)
    channels = serializers.ListField(
        child=serializers.ChoiceField(choices=settings.CHANNELS), required=False, allow_empty=False, max_length=5
    )
    payload = serializers.DictField(required=False, default=dict)
    dedup_key = serializers.CharField(max_length=255, required=False, allow_blank=False)
    priority = serializers.ChoiceField(choices=Notification.Priority.choices, required=False)
    locale = serializers.CharField(max_length=35, required=False, allow_blank=False)
    send_at = serializers.DateTimeField(required=False)
    send_at_local = serializers.CharField(max_length=32, required=False)
    # Smarter delivery (notifier/strategy.py).
    strategy = serializers.ChoiceField(choices=STRATEGIES, required=False)
    fallback_until = serializers.ChoiceField(choices=FALLBACK_UNTIL, required=False)
    fallback_after_seconds = serializers.IntegerField(min_value=1, max_value=MAX_AFTER_SECONDS, required=False)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)

    def validate_category(self, value: str) -> str:
        if value not in settings.NOTIFIER_CATEGORIES:
            known = ", ".join(sorted(settings.NOTIFIER_CATEGORIES))
            raise serializers.ValidationError(f"Unknown category. Configured categories: {known}.")
        return value

    def validate_template(self, value: str) -> str:
        if not TEMPLATE_SPEC.match(value):
            raise serializers.ValidationError("Expected a template key, optionally pinned: 'key' or 'key@3'.")
        return value

    def validate_locale(self, value: str) -> str:
        if not LOCALE.match(value):
            raise serializers.ValidationError("Expected a language tag such as 'de' or 'pt-BR'.")
        return value

    def validate_send_at_local(self, value: str) -> str:
        try:
            return parse_wall_clock(value).isoformat()
        except ValueError as exc:
            message = str(exc) if "offset" in str(exc) else "Expected a local date and time: 2026-12-01T09:00:00."
            raise serializers.ValidationError(message) from None

    def validate_channels(self, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise serializers.ValidationError("Each channel may appear once.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("recipient" in attrs) == ("topic" in attrs):
            raise serializers.ValidationError({"recipient": ["Give exactly one of 'recipient' and 'topic'."]})
        if "send_at_local" in attrs and "send_at" in attrs:
            raise serializers.ValidationError({"send_at_local": ["Give send_at or send_at_local, not both."]})
        if attrs.get("strategy") != "fallback":
            stray = [name for name in ("fallback_until", "fallback_after_seconds") if name in attrs]
            if stray:
                raise serializers.ValidationError({name: ["Only with strategy 'fallback'."] for name in stray})
        return attrs


def _event_out(event: Any) -> dict[str, Any]:
    return {"status": event.status, "detail": event.detail, "at": event.at}


def delivery_out(delivery: Delivery, *, events: bool) -> dict[str, Any]:
    """Render a delivery for the API."""
    body: dict[str, Any] = {
        "id": delivery.pk,
        "channel": delivery.channel,
        "status": delivery.status,
        "reason": delivery.reason,
    }
    if events:
        body |= {
            "provider": delivery.provider,
            "provider_message_id": delivery.provider_message_id,
            "attempts": delivery.attempts,
            "last_error": delivery.last_error,
            "template_version": delivery.template_version_id,
            "not_before": delivery.not_before,
            "sent_at": delivery.sent_at,
            "events": [_event_out(e) for e in delivery.events.all()],
        }
        if delivery.channel == "sms":
            body |= {"encoding": delivery.sms_encoding or None, "segments": delivery.sms_segments}
    return body


def accept_out(result: AcceptResult) -> dict[str, Any]:
    """Render the answer to an accepted (or duplicate) request."""
    n = result.notification
    body: dict[str, Any] = {
        "id": str(n.pk),
        "status": "accepted",
        "duplicate": result.duplicate,
        "deliveries": [delivery_out(d, events=False) for d in result.deliveries],
    }
    if n.topic_id:
        body["topic"] = n.topic.key if n.topic else None
        if n.recipients_total is not None:
            body["recipients_total"] = n.recipients_total
    return body


def notification_out(n: Notification) -> dict[str, Any]:
    """Render a notification with its deliveries and their events."""
    body: dict[str, Any] = {
        "id": str(n.pk),
        "status": n.status,
        "category": n.category,
        "template": n.template_key,
        "template_version": n.template_version,
        "channels": n.channels,
        "priority": n.priority,
        "user_id": n.user_id or None,
        "topic": n.topic.key if n.topic_id and n.topic else None,
        "dedup_key": n.dedup_key,
        "send_at": n.send_at,
        "send_at_local": n.send_at_local or None,
        "strategy": n.strategy,
        "created_at": n.created_at,
        "trace_id": n.trace_id,
    }
    if n.strategy == "fallback":
        body |= {"fallback_until": n.fallback_until, "fallback_after_seconds": n.fallback_after_seconds}
    if n.topic_id:
        body["recipients_total"] = n.recipients_total
        body["fanout"] = {"processed": n.fanout_processed, "done": n.status != Notification.Status.FANNING_OUT}
    return body


def trace_id_of(request: Request) -> str:
    """Return the W3C trace id of the request (set by the request middleware), or ""."""
    return getattr(request._request, "trace_id", "") or ""


class NotificationListCreateApi(APIView):
    """POST: accept a notification. GET: list the client's notifications."""

    required_scope = "send"

    def post(self, request: Request) -> Response:
        serializer = NotificationInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        _shed_if_overloaded(serializer.validated_data)
        result = notification_accept(
            client=request_client(request), data=serializer.validated_data, trace_id=trace_id_of(request)
        )
        code = status.HTTP_200_OK if result.duplicate else status.HTTP_202_ACCEPTED
        return Response(accept_out(result), status=code)

    def get(self, request: Request) -> Response:
        filters = {k: request.query_params.get(k) for k in ("user_id", "status", "category")}
        if filters["status"] and filters["status"] not in Notification.Status.values:
            raise ApiError(400, "invalid", "Unknown status.", {"status": ["Unknown status."]})
        cursor = request.query_params.get("cursor")
        try:
            page, next_cursor = notification_list(client=request_client(request), filters=filters, cursor=cursor)
        except ValueError:
            raise ApiError(400, "invalid", "Invalid cursor.", {"cursor": ["Invalid cursor."]}) from None
        return Response({"results": [notification_out(n) for n in page], "next_cursor": next_cursor})


def _shed_if_overloaded(data: dict[str, Any]) -> None:
    """Answer 429 to low-priority requests while the low-priority backlog is too deep (see backpressure)."""
    from notifier.backpressure import check_backpressure
    from templates_app.selectors import TemplateNotFound, template_version_resolve

    category = data.get("category")
    if not category and data.get("priority") != "high":
        try:
            category = template_version_resolve(data["template"]).template.category
        except TemplateNotFound:
            return  # accepting answers the 400
    check_backpressure(category=category or "", priority=data.get("priority"))


class NotificationBatchApi(APIView):
    """Accept up to 1,000 notifications in one call; one result (or error) per item, in order.

    Items are validated one by one (a bad item is its own 400), then accepted together: one statement per
    table and one publish for the whole batch (notifier.services.notifications_accept_batch).
    """

    required_scope = "send"

    def post(self, request: Request) -> Response:
        items = request.data.get("notifications") if isinstance(request.data, dict) else request.data
        if not isinstance(items, list) or not items:
            raise ApiError(400, "invalid", "Expected a non-empty list.", {"notifications": ["Expected a list."]})
        if len(items) > BATCH_LIMIT:
            message = f"At most {BATCH_LIMIT} items per batch."
            raise ApiError(400, "invalid", message, {"notifications": [message]})
        # One serializer instance for every item: DRF deep-copies its declared fields per instance, which was
        # most of a batch's validation time.
        validator = NotificationInput()
        checked = [self._validate(validator, item) for item in items]
        valid = [(i, data) for i, data in enumerate(checked) if not isinstance(data, Exception)]
        accepted = notifications_accept_batch(
            client=request_client(request), items=[data for _, data in valid], trace_id=trace_id_of(request)
        )
        results: list[Any] = list(checked)
        for (index, _), result in zip(valid, accepted, strict=True):
            results[index] = result
        return Response({"results": [_item_out(result) for result in results]}, status=status.HTTP_200_OK)

    @staticmethod
    def _validate(validator: NotificationInput, item: Any) -> dict[str, Any] | serializers.ValidationError | ApiError:
        try:
            data = validator.run_validation(item)
            _shed_if_overloaded(data)
        except (serializers.ValidationError, ApiError) as exc:
            return exc
        except DjangoValidationError as exc:
            return serializers.ValidationError(detail=serializers.as_serializer_error(exc))
        return dict(data)


def _item_out(result: AcceptResult | Exception) -> dict[str, Any]:
    """Render one item's result with the HTTP status it would have had alone (202 new, 200 duplicate, 4xx)."""
    from notifier.errors import exception_handler

    if isinstance(result, Exception):
        response = exception_handler(result, {})
        assert response is not None
        return {**response.data, "status": response.status_code}
    return {**accept_out(result), "status": 200 if result.duplicate else 202}


class NotificationDetailApi(APIView):
    """GET one notification with its deliveries and their event history."""

    required_scope = "send"

    def get(self, request: Request, notification_id: str) -> Response:
        notification = notification_get(client=request_client(request), notification_id=str(notification_id))
        if notification is None:
            return Response(error_body("not_found", "No such notification."), status=404)
        body = notification_out(notification)
        body["deliveries"] = [delivery_out(d, events=True) for d in notification.first_deliveries]
        body["delivery_counts"] = notification_delivery_counts(notification=notification)
        return Response(body)


class NotificationCancelApi(APIView):
    """Cancel the deliveries of a notification that are not yet sent."""

    required_scope = "send"

    def post(self, request: Request, notification_id: str) -> Response:
        notification = Notification.objects.filter(client=request_client(request), pk=notification_id).first()
        if notification is None:
            return Response(error_body("not_found", "No such notification."), status=404)
        cancelled = notification_cancel(notification=notification)
        return Response({"id": str(notification.pk), "cancelled": cancelled})
