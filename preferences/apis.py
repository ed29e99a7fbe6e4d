"""REST endpoints for recipients, devices, preferences, topics, subscribers and suppressions (see docs/api.md).

Bodies and answers are the serializers of preferences/serializers.py.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import ApiError
from core.keys import require_key
from core.pagination import CursorPage, CursorQuerySerializer, cursor_id
from core.scopes import RECIPIENT_SCOPES
from preferences import bulk, selectors, services
from preferences.models import Recipient, Suppression, Topic
from preferences.serializers import (
    DeviceInputSerializer,
    DeviceOutputSerializer,
    PreferenceLinkInputSerializer,
    PreferenceLinkOutputSerializer,
    PreferencesOutputSerializer,
    PreferencesSerializer,
    RecipientBatchInputSerializer,
    RecipientBatchOutputSerializer,
    RecipientInputSerializer,
    RecipientListQuerySerializer,
    RecipientOutputSerializer,
    RecipientPage,
    SubscribersInputSerializer,
    SubscribersOutputSerializer,
    SuppressionFilterSerializer,
    SuppressionInputSerializer,
    SuppressionOutputSerializer,
    SuppressionPage,
    TopicInputSerializer,
    TopicOutputSerializer,
    TopicPage,
    recipient_batch_answer,
)


def _not_found(what: str) -> ApiError:
    return ApiError(status.HTTP_404_NOT_FOUND, "not_found", f"{what} not found.")


def _recipient_or_404(user_id: str) -> Recipient:
    recipient = selectors.recipient_get(user_id=user_id)
    if recipient is None:
        raise _not_found("Recipient")
    return recipient


def _topic_or_404(key: str) -> Topic:
    topic = selectors.topic_get(key=key)
    if topic is None:
        raise _not_found("Topic")
    return topic


def _keyset_page(rows: list[Any], limit: int) -> CursorPage:
    """Return the page of `rows` (fetched with one row beyond `limit`) and where the next one starts."""
    page = rows[:limit]
    return CursorPage(page, page[-1].pk if len(rows) > limit else None)


# --- Recipients --------------------------------------------------------------------------------------------


class RecipientListApi(APIView):
    """GET /recipients: recipients oldest first, optionally by exact email or phone; keyset-paginated."""

    required_scope = "recipients:read"

    @extend_schema(
        operation_id="recipients_list",
        summary="List or find recipients",
        parameters=[RecipientListQuerySerializer],
        responses=RecipientPage,
    )
    def get(self, request: Request) -> Response:
        params = RecipientListQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        q = params.validated_data
        rows = selectors.recipient_list(
            email=q.get("email") or None,
            phone=q.get("phone") or None,
            after_id=cursor_id(q.get("cursor")) or 0,
            limit=q["limit"] + 1,
        )
        return Response(RecipientPage(_keyset_page(rows, q["limit"])).data)


class RecipientApi(APIView):
    """PUT creates or updates a recipient, GET shows it, DELETE erases its personal data."""

    required_scopes = RECIPIENT_SCOPES

    @extend_schema(
        operation_id="recipient_put",
        summary="Create or update a recipient",
        request=RecipientInputSerializer,
        responses={
            200: OpenApiResponse(RecipientOutputSerializer, description="Updated."),
            201: OpenApiResponse(RecipientOutputSerializer, description="Created."),
        },
    )
    def put(self, request: Request, user_id: str) -> Response:
        if len(user_id) > 255:
            raise ApiError(400, "invalid", "user_id is too long.", {"user_id": ["At most 255 characters."]})
        data = RecipientInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        recipient, created = services.recipient_upsert(user_id=user_id, audit_actor=request.user, **data.validated_data)
        return Response(
            RecipientOutputSerializer(recipient).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )

    @extend_schema(operation_id="recipient_get", summary="Read a recipient", responses=RecipientOutputSerializer)
    def get(self, request: Request, user_id: str) -> Response:
        return Response(RecipientOutputSerializer(_recipient_or_404(user_id)).data)

    @extend_schema(operation_id="recipient_erase", summary="Erase a recipient's personal data", responses={204: None})
    def delete(self, request: Request, user_id: str) -> Response:
        services.recipient_erase(recipient=_recipient_or_404(user_id), audit_actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class RecipientBatchApi(RecipientApi):
    """POST /recipients/batch creates or updates up to 1,000 recipients, each alone (a bad item fails alone).

    Each item takes `user_id`, the fields of `PUT /recipients/{user_id}` (checked the same way; those sent
    replace those fields) and `topics` (existing topics to join; needs the `topics` scope too). One result per
    item, in order: 201 created, 200 updated, 400 refused with the error body's `error`.
    """

    # The route comes before `recipients/{user_id}`: a recipient whose user id is "batch" is still read,
    # changed and erased here by RecipientApi's methods (left out of the schema, where RecipientApi has them).
    required_scopes = RECIPIENT_SCOPES

    @extend_schema(
        operation_id="recipients_batch",
        summary="Create or update recipients in bulk",
        request=RecipientBatchInputSerializer,
        responses={200: RecipientBatchOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        data = RecipientBatchInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        items = data.validated_data["recipients"]
        # Joining topics is the `topics` scope's, whichever endpoint does it.
        joins = any(isinstance(item, dict) and item.get("topics") for item in items)
        if joins and "topics" not in (getattr(request.user, "scopes", None) or ()):
            raise ApiError(403, "scope_missing", "This API key lacks the scope 'topics'.", {"scope": ["topics"]})
        results = bulk.recipients_batch(items=items, audit_actor=request.user)
        return Response(recipient_batch_answer([r.as_dict() for r in results]))

    @extend_schema(exclude=True)
    def put(self, request: Request, user_id: str = "batch") -> Response:
        return super().put(request, user_id)

    @extend_schema(exclude=True)
    def get(self, request: Request, user_id: str = "batch") -> Response:
        return super().get(request, user_id)

    @extend_schema(exclude=True)
    def delete(self, request: Request, user_id: str = "batch") -> Response:
        return super().delete(request, user_id)


class DeviceListApi(APIView):
    """POST registers a push token for a recipient (idempotent)."""

    required_scopes = RECIPIENT_SCOPES

    @extend_schema(
        operation_id="recipient_device_add",
        summary="Register a push device",
        request=DeviceInputSerializer,
        responses={201: DeviceOutputSerializer},
    )
    def post(self, request: Request, user_id: str) -> Response:
        recipient = _recipient_or_404(user_id)
        data = DeviceInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        device, _ = services.device_add(recipient=recipient, audit_actor=request.user, **data.validated_data)
        # 201 also for a token registered before: apps re-register on every start and expect one answer.
        return Response(DeviceOutputSerializer(device).data, status=status.HTTP_201_CREATED)


class DeviceDetailApi(APIView):
    """DELETE removes one of a recipient's push tokens."""

    required_scopes = RECIPIENT_SCOPES

    @extend_schema(operation_id="recipient_device_remove", summary="Remove a push device", responses={204: None})
    def delete(self, request: Request, user_id: str, token: str) -> Response:
        if not services.device_remove(recipient=_recipient_or_404(user_id), token=token, audit_actor=request.user):
            raise _not_found("Device")
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- Preferences -------------------------------------------------------------------------------------------


class PreferencesApi(APIView):
    """GET shows a recipient's preferences; PUT replaces them."""

    required_scopes = RECIPIENT_SCOPES

    @extend_schema(operation_id="preferences_get", summary="Read preferences", responses=PreferencesOutputSerializer)
    def get(self, request: Request, user_id: str) -> Response:
        preferences = selectors.recipient_preferences(recipient=_recipient_or_404(user_id))
        return Response(PreferencesOutputSerializer(preferences).data)

    @extend_schema(
        operation_id="preferences_put",
        summary="Replace preferences",
        request=PreferencesSerializer,
        responses=PreferencesOutputSerializer,
    )
    def put(self, request: Request, user_id: str) -> Response:
        recipient = _recipient_or_404(user_id)
        data = PreferencesSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        quiet = data.validated_data["quiet_hours"] or {}
        recipient = services.preferences_set(
            recipient=recipient,
            opted_out=data.validated_data["opted_out"],
            channels=data.validated_data["channels"],
            categories=data.validated_data["categories"],
            quiet_start=quiet.get("start"),
            quiet_end=quiet.get("end"),
            audit_actor=request.user,
        )
        return Response(PreferencesOutputSerializer(selectors.recipient_preferences(recipient=recipient)).data)


class PreferenceLinkApi(APIView):
    """POST mints a signed, expiring link to the recipient's preference center (no login needed to open it)."""

    required_scope = "recipients:write"

    @extend_schema(
        operation_id="preference_link_create",
        summary="Mint a preference-center link",
        request=PreferenceLinkInputSerializer,
        responses={200: PreferenceLinkOutputSerializer},
    )
    def post(self, request: Request, user_id: str) -> Response:
        recipient = _recipient_or_404(user_id)
        data = PreferenceLinkInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        url, expires_at = services.preference_link(recipient=recipient, ttl_seconds=data.validated_data["ttl_seconds"])
        return Response(PreferenceLinkOutputSerializer({"url": url, "expires_at": expires_at}).data)


# --- Suppressions ------------------------------------------------------------------------------------------


class SuppressionListApi(APIView):
    """GET pages the suppression list by keyset cursor; POST adds an address (idempotent)."""

    required_scope = "suppressions"

    @extend_schema(
        operation_id="suppressions_list",
        summary="List suppressions",
        parameters=[SuppressionFilterSerializer],
        responses=SuppressionPage,
    )
    def get(self, request: Request) -> Response:
        params = SuppressionFilterSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        q = params.validated_data
        after = cursor_id(q.get("cursor")) or 0
        rows = selectors.suppression_list(
            channel=q.get("channel"), address=q.get("address"), after_id=after, limit=q["limit"] + 1
        )
        page, more = rows[: q["limit"]], len(rows) > q["limit"]
        return Response(SuppressionPage(CursorPage(page, page[-1].pk if more else None)).data)

    @extend_schema(
        operation_id="suppression_add",
        summary="Suppress an address",
        request=SuppressionInputSerializer,
        responses={
            201: OpenApiResponse(SuppressionOutputSerializer, description="Added."),
            200: OpenApiResponse(SuppressionOutputSerializer, description="Already on the list."),
        },
    )
    def post(self, request: Request) -> Response:
        data = SuppressionInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        existed = selectors.suppression_exists(
            channel=data.validated_data["channel"], address=data.validated_data["address"], own_only=True
        )
        suppression = services.suppression_add(
            source=Suppression.Source.MANUAL, audit_actor=request.user, **data.validated_data
        )
        return Response(
            SuppressionOutputSerializer(suppression).data,
            status=status.HTTP_200_OK if existed else status.HTTP_201_CREATED,
        )


class SuppressionDetailApi(APIView):
    """DELETE takes an address off the suppression list."""

    required_scope = "suppressions"

    @extend_schema(operation_id="suppression_remove", summary="Remove a suppression", responses={204: None})
    def delete(self, request: Request, suppression_id: int) -> Response:
        # An installation-wide entry (a provider's bounce or complaint) is read-only to every project's keys.
        suppression = selectors.suppression_get(suppression_id=suppression_id, own_only=True)
        if suppression is None:
            raise _not_found("Suppression")
        services.suppression_remove(suppression=suppression, audit_actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- Topics ------------------------------------------------------------------------------------------------


class TopicListApi(APIView):
    """GET /topics: every topic, oldest first, keyset-paginated."""

    required_scope = "topics"

    @extend_schema(
        operation_id="topics_list", summary="List topics", parameters=[CursorQuerySerializer], responses=TopicPage
    )
    def get(self, request: Request) -> Response:
        params = CursorQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        q = params.validated_data
        rows = selectors.topic_list(after_id=cursor_id(q.get("cursor")) or 0, limit=q["limit"] + 1)
        return Response(TopicPage(_keyset_page(rows, q["limit"])).data)


class TopicApi(APIView):
    """PUT creates or renames a topic; GET shows it with its subscriber count."""

    required_scope = "topics"

    @extend_schema(
        operation_id="topic_put",
        summary="Create or rename a topic",
        request=TopicInputSerializer,
        responses={
            200: OpenApiResponse(TopicOutputSerializer, description="Renamed."),
            201: OpenApiResponse(TopicOutputSerializer, description="Created."),
        },
    )
    def put(self, request: Request, key: str) -> Response:
        require_key(key)
        data = TopicInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        topic, created = services.topic_upsert(key=key, name=data.validated_data["name"])
        return Response(
            TopicOutputSerializer(topic).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )

    @extend_schema(operation_id="topic_get", summary="Read a topic", responses=TopicOutputSerializer)
    def get(self, request: Request, key: str) -> Response:
        return Response(TopicOutputSerializer(_topic_or_404(key)).data)


class TopicSubscribersApi(APIView):
    """POST subscribes user ids to a topic in bulk, creating unknown recipients."""

    required_scope = "topics"

    @extend_schema(
        operation_id="topic_subscribe",
        summary="Subscribe user ids to a topic",
        request=SubscribersInputSerializer,
        responses=SubscribersOutputSerializer,
    )
    def post(self, request: Request, key: str) -> Response:
        topic = _topic_or_404(key)
        data = SubscribersInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        added = services.topic_subscribe(topic=topic, user_ids=data.validated_data["user_ids"])
        counts = {"added": added, "total": selectors.topic_subscriber_count(topic=topic)}
        return Response(SubscribersOutputSerializer(counts).data)


class TopicSubscriberApi(APIView):
    """DELETE unsubscribes one user id from a topic."""

    required_scope = "topics"

    @extend_schema(operation_id="topic_unsubscribe", summary="Unsubscribe a user id", responses={204: None})
    def delete(self, request: Request, key: str, user_id: str) -> Response:
        services.topic_unsubscribe(topic=_topic_or_404(key), user_id=user_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
