"""REST endpoints of the client's own event endpoint (scope `send`). Thin: validate, call a service, render."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import ApiError
from core.pagination import CursorPage, cursor_id
from notifier.clients.auth import request_client
from notifier.statusevents.models import EventEndpoint
from notifier.statusevents.selectors import event_attempts_list, event_endpoint_get
from notifier.statusevents.serializers import (
    EventAttemptPage,
    EventAttemptsQuery,
    EventEndpointInput,
    EventEndpointOutput,
)
from notifier.statusevents.services import event_endpoint_delete, event_endpoint_put, event_endpoint_rotate_secret

NO_ENDPOINT = "No event endpoint configured."


def _endpoint_or_404(request: Request) -> EventEndpoint:
    endpoint = event_endpoint_get(client=request_client(request))
    if endpoint is None:
        raise ApiError(404, "not_found", "No event endpoint configured.")
    return endpoint


class EventEndpointApi(APIView):
    """The calling service's event endpoint: PUT to create or change, GET, DELETE."""

    required_scope = "send"
    error_statuses = {"get": {404: NO_ENDPOINT}, "delete": {404: NO_ENDPOINT}}

    @extend_schema(
        operation_id="event_endpoint_put",
        summary="Create or change the event endpoint",
        request=EventEndpointInput,
        responses=EventEndpointOutput,
    )
    def put(self, request: Request) -> Response:
        data = EventEndpointInput(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        statuses = [t.removeprefix("delivery.") for t in dict.fromkeys(v["events"])]
        endpoint, secret = event_endpoint_put(
            client=request_client(request), url=v["url"], statuses=statuses, max_batch=v["max_batch"]
        )
        return Response(EventEndpointOutput(endpoint, context={"secret": secret}).data)

    @extend_schema(operation_id="event_endpoint_get", summary="Read the event endpoint", responses=EventEndpointOutput)
    def get(self, request: Request) -> Response:
        return Response(EventEndpointOutput(_endpoint_or_404(request)).data)

    @extend_schema(operation_id="event_endpoint_delete", summary="Delete the event endpoint", responses={204: None})
    def delete(self, request: Request) -> Response:
        if not event_endpoint_delete(client=request_client(request)):
            raise ApiError(404, "not_found", "No event endpoint configured.")
        return Response(status=204)


class EventEndpointRotateSecretApi(APIView):
    """Replace the endpoint's signing secret; the new one is shown once, here."""

    required_scope = "send"
    error_statuses = {404: NO_ENDPOINT}

    @extend_schema(
        operation_id="event_endpoint_rotate_secret",
        summary="Rotate the signing secret",
        request=None,
        responses=EventEndpointOutput,
    )
    def post(self, request: Request) -> Response:
        endpoint = _endpoint_or_404(request)
        secret = event_endpoint_rotate_secret(endpoint=endpoint)
        endpoint.refresh_from_db()
        return Response(EventEndpointOutput(endpoint, context={"secret": secret}).data)


class EventAttemptsApi(APIView):
    """Recent delivery attempts to the endpoint, newest first (keyset-paginated)."""

    required_scope = "send"
    error_statuses = {404: NO_ENDPOINT}

    @extend_schema(
        operation_id="event_endpoint_attempts",
        summary="List recent attempts",
        parameters=[EventAttemptsQuery],
        responses=EventAttemptPage,
    )
    def get(self, request: Request) -> Response:
        params = EventAttemptsQuery(data=request.query_params)
        params.is_valid(raise_exception=True)
        before = cursor_id(params.validated_data.get("cursor"))
        endpoint = _endpoint_or_404(request)
        rows, next_id = event_attempts_list(endpoint=endpoint, before_id=before, limit=params.validated_data["limit"])
        return Response(EventAttemptPage(CursorPage(rows, next_id)).data)
