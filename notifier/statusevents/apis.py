"""REST endpoints of the client's own event endpoint (scope `send`). Thin: validate, call a service, render."""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from notifier.auth import request_client
from notifier.errors import ApiError
from notifier.models import EventEndpoint
from notifier.reach import EVENT_STATUSES
from notifier.statusevents.selectors import event_attempts_list, event_endpoint_get
from notifier.statusevents.services import event_endpoint_delete, event_endpoint_put, event_endpoint_rotate_secret

EVENT_TYPES = [f"delivery.{s}" for s in EVENT_STATUSES]


def _address_refusal(host: str) -> str | None:
    # Imported here: the guard lives with the webhook adapter (channels_app); only its pure decision is used.
    from channels_app.ssrf import address_refusal

    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None  # a name: resolved and checked on every request by the sender
    return address_refusal(ip, allow_private=settings.WEBHOOK_ALLOW_PRIVATE_TARGETS)


class EventEndpointInput(serializers.Serializer):
    """The body of PUT /api/v1/event-endpoint."""

    url = serializers.URLField(max_length=2048)
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=EVENT_TYPES), required=False, allow_empty=False, default=EVENT_TYPES
    )
    max_batch = serializers.IntegerField(min_value=1, max_value=settings.EVENT_MAX_BATCH, default=1)

    def validate_url(self, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https"):
            raise serializers.ValidationError("Only http and https URLs.")
        reason = _address_refusal(parts.hostname or "")
        if reason:
            raise serializers.ValidationError(f"This address is not allowed as a target ({reason}).")
        return value


class EventEndpointOutput(serializers.Serializer):
    """An event endpoint; `secret` only right after creation or rotation."""

    url = serializers.URLField()
    events = serializers.SerializerMethodField()
    max_batch = serializers.IntegerField()
    is_active = serializers.BooleanField()
    failures = serializers.IntegerField()
    retry_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    secret = serializers.CharField(required=False)

    def get_events(self, obj: EventEndpoint) -> list[str]:
        return [f"delivery.{s}" for s in obj.statuses]


def endpoint_out(endpoint: EventEndpoint, secret: str | None = None) -> dict[str, Any]:
    """Render an endpoint for the API (with its secret when just created or rotated)."""
    body: dict[str, Any] = dict(EventEndpointOutput(endpoint).data)
    body.pop("secret", None)
    if secret:
        body["secret"] = secret
    return body


def _endpoint_or_404(request: Request) -> EventEndpoint:
    endpoint = event_endpoint_get(client=request_client(request))
    if endpoint is None:
        raise ApiError(404, "not_found", "No event endpoint configured.")
    return endpoint


class EventEndpointApi(APIView):
    """The calling service's event endpoint: PUT to create or change, GET, DELETE."""

    required_scope = "send"

    @extend_schema(request=EventEndpointInput, responses=EventEndpointOutput)
    def put(self, request: Request) -> Response:
        data = EventEndpointInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        statuses = [t.removeprefix("delivery.") for t in dict.fromkeys(v["events"])]
        endpoint, secret = event_endpoint_put(
            client=request_client(request), url=v["url"], statuses=statuses, max_batch=v["max_batch"]
        )
        return Response(endpoint_out(endpoint, secret))

    @extend_schema(responses=EventEndpointOutput)
    def get(self, request: Request) -> Response:
        return Response(endpoint_out(_endpoint_or_404(request)))

    @extend_schema(responses={204: None})
    def delete(self, request: Request) -> Response:
        if not event_endpoint_delete(client=request_client(request)):
            raise ApiError(404, "not_found", "No event endpoint configured.")
        return Response(status=204)


class EventEndpointRotateSecretApi(APIView):
    """Replace the endpoint's signing secret; the new one is shown once, here."""

    required_scope = "send"

    @extend_schema(request=None, responses=EventEndpointOutput)
    def post(self, request: Request) -> Response:
        endpoint = _endpoint_or_404(request)
        secret = event_endpoint_rotate_secret(endpoint=endpoint)
        endpoint.refresh_from_db()
        return Response(endpoint_out(endpoint, secret))


class EventAttemptsApi(APIView):
    """Recent delivery attempts to the endpoint, newest first (keyset-paginated)."""

    required_scope = "send"

    class InputSerializer(serializers.Serializer):
        cursor = serializers.RegexField(r"^[1-9][0-9]{0,18}$", required=False, allow_blank=True)
        limit = serializers.IntegerField(required=False, min_value=1, max_value=200, default=50)

    class AttemptSerializer(serializers.Serializer):
        id = serializers.IntegerField()
        at = serializers.DateTimeField()
        ok = serializers.BooleanField()
        status_code = serializers.IntegerField(allow_null=True)
        error = serializers.CharField()
        events = serializers.IntegerField()
        first_event_id = serializers.SerializerMethodField()
        last_event_id = serializers.SerializerMethodField()
        given_up = serializers.IntegerField()
        duration_ms = serializers.IntegerField()

        def get_first_event_id(self, obj: Any) -> str:
            return f"evt_{obj.first_event_id}"

        def get_last_event_id(self, obj: Any) -> str:
            return f"evt_{obj.last_event_id}"

    class OutputSerializer(serializers.Serializer):
        items = serializers.ListField(child=serializers.DictField())
        next_cursor = serializers.CharField(allow_null=True)

        class Meta:
            ref_name = "EventAttemptPage"

    @extend_schema(parameters=[InputSerializer], responses=OutputSerializer)
    def get(self, request: Request) -> Response:
        params = self.InputSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        endpoint = _endpoint_or_404(request)
        cursor = params.validated_data.get("cursor")
        rows, next_id = event_attempts_list(
            endpoint=endpoint, before_id=int(cursor) if cursor else None, limit=params.validated_data["limit"]
        )
        return Response(
            {
                "items": self.AttemptSerializer(rows, many=True).data,
                "next_cursor": str(next_id) if next_id is not None else None,
            }
        )
