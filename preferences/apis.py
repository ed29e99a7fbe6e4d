"""REST endpoints for recipients, devices, preferences, topics, subscribers and suppressions (see API.md)."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import re
import zoneinfo
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from notifier.errors import ApiError
from notifier.scopes import RECIPIENT_SCOPES
from preferences import selectors, services
from preferences.compliance import FREQUENCIES, is_optional
from preferences.models import Recipient, Suppression, Topic
from preferences.phones import InvalidPhoneNumber, phone_normalize

# BCP 47 in the shape callers send it ("de", "de-DE", "zh-Hant-TW"); underscores are accepted and normalised.
LOCALE = re.compile(r"^[A-Za-z]{2,3}(?:-[A-Za-z0-9]{1,8})*$")
HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")
MAX_SUBSCRIBERS_PER_CALL = 10_000
PAGE_DEFAULT, PAGE_MAX = 100, 1000


@functools.cache
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


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


def _encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(str(last_id).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> int:
    try:
        value = int(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode())
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ApiError(400, "invalid", "Invalid cursor.", {"cursor": ["Invalid cursor."]}) from None
    if value < 0:
        raise ApiError(400, "invalid", "Invalid cursor.", {"cursor": ["Invalid cursor."]})
    return value


# --- Recipients --------------------------------------------------------------------------------------------


class RecipientInputSerializer(serializers.Serializer):
    """Contact data of a recipient; fields left out keep their current value, null or "" clears them."""

    email = serializers.EmailField(max_length=320, required=False, allow_blank=True, allow_null=True)
    phone = serializers.CharField(max_length=32, required=False, allow_blank=True, allow_null=True)
    locale = serializers.CharField(max_length=35, required=False, allow_blank=True, allow_null=True)
    timezone = serializers.CharField(max_length=64, required=False, allow_blank=True, allow_null=True)
    webhook_url = serializers.URLField(max_length=2048, required=False, allow_blank=True, allow_null=True)
    tracking_opt_out = serializers.BooleanField(required=False)

    def validate_phone(self, value: str | None) -> str:
        if not value:
            return ""
        try:
            return phone_normalize(value)
        except InvalidPhoneNumber as exc:
            raise serializers.ValidationError(f"{exc} Expected E.164 such as +4915112345678.") from None

    def validate_locale(self, value: str | None) -> str:
        value = (value or "").replace("_", "-")
        if value and not LOCALE.match(value):
            raise serializers.ValidationError("Must be a language tag such as 'de' or 'de-DE'.")
        return value

    def validate_timezone(self, value: str | None) -> str:
        if value and value not in _zones():
            raise serializers.ValidationError("Must be an IANA time zone such as 'Europe/Berlin'.")
        return value or ""

    def validate_webhook_url(self, value: str | None) -> str:
        if value and not value.lower().startswith(("https://", "http://")):
            raise serializers.ValidationError("Must be an http(s) URL.")
        return value or ""

    def validate_email(self, value: str | None) -> str:
        return value or ""


class RecipientOutputSerializer(serializers.Serializer):
    """A recipient as the API shows it."""

    user_id = serializers.CharField()
    email = serializers.CharField()
    phone = serializers.CharField()
    locale = serializers.CharField()
    timezone = serializers.CharField()
    webhook_url = serializers.CharField()
    tracking_opt_out = serializers.BooleanField()
    devices = serializers.SerializerMethodField()
    preferences = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def get_devices(self, obj: Recipient) -> list[dict[str, Any]]:
        return selectors.recipient_device_tokens(recipient=obj)

    def get_preferences(self, obj: Recipient) -> dict[str, Any]:
        return selectors.recipient_preferences(recipient=obj)


class RecipientApi(APIView):
    """PUT creates or updates a recipient, GET shows it, DELETE erases its personal data."""

    required_scopes = RECIPIENT_SCOPES

    def put(self, request: Request, user_id: str) -> Response:
        if len(user_id) > 255:
            raise ApiError(400, "invalid", "user_id is too long.", {"user_id": ["At most 255 characters."]})
        data = RecipientInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        recipient, created = services.recipient_upsert(user_id=user_id, audit_actor=request.user, **data.validated_data)
        return Response(
            RecipientOutputSerializer(recipient).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )

    def get(self, request: Request, user_id: str) -> Response:
        return Response(RecipientOutputSerializer(_recipient_or_404(user_id)).data)

    def delete(self, request: Request, user_id: str) -> Response:
        services.recipient_erase(recipient=_recipient_or_404(user_id), audit_actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class DeviceInputSerializer(serializers.Serializer):
    """A push token to register."""

    platform = serializers.ChoiceField(choices=["fcm"], default="fcm")
    token = serializers.CharField(max_length=4096, trim_whitespace=True)


class DeviceListApi(APIView):
    """POST registers a push token for a recipient (idempotent)."""

    required_scopes = RECIPIENT_SCOPES

    def post(self, request: Request, user_id: str) -> Response:
        recipient = _recipient_or_404(user_id)
        data = DeviceInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        device, _ = services.device_add(recipient=recipient, audit_actor=request.user, **data.validated_data)
        # 201 also for a token registered before: apps re-register on every start and expect one answer.
        body = {"platform": device.platform, "token": device.token, "active": device.active}
        return Response(body, status=status.HTTP_201_CREATED)


class DeviceDetailApi(APIView):
    """DELETE removes one of a recipient's push tokens."""

    required_scopes = RECIPIENT_SCOPES

    def delete(self, request: Request, user_id: str, token: str) -> Response:
        if not services.device_remove(recipient=_recipient_or_404(user_id), token=token, audit_actor=request.user):
            raise _not_found("Device")
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- Preferences -------------------------------------------------------------------------------------------


class CategoryPrefSerializer(serializers.Serializer):
    """One category's settings."""

    enabled = serializers.BooleanField(default=True)
    channels = serializers.ListField(child=serializers.CharField(), required=False, allow_null=True)
    frequency = serializers.ChoiceField(choices=list(FREQUENCIES), default="immediate")

    def validate_channels(self, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        unknown = sorted(set(value) - set(settings.CHANNELS))
        if unknown:
            raise serializers.ValidationError(f"Unknown channel(s): {', '.join(unknown)}.")
        return list(dict.fromkeys(value))

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            extra = sorted(set(data) - set(self.fields))
            if extra:
                raise serializers.ValidationError({key: ["Unknown field."] for key in extra})
        return super().to_internal_value(data)


class QuietHoursSerializer(serializers.Serializer):
    """A daily window in the recipient's time zone, "HH:MM" to "HH:MM" (may wrap midnight)."""

    start = serializers.RegexField(HHMM, error_messages={"invalid": "Must be HH:MM (00:00 to 23:59)."})
    end = serializers.RegexField(HHMM, error_messages={"invalid": "Must be HH:MM (00:00 to 23:59)."})

    def validate(self, attrs: dict[str, str]) -> dict[str, dt.time]:
        start, end = dt.time.fromisoformat(attrs["start"]), dt.time.fromisoformat(attrs["end"])
        if start == end:
            raise serializers.ValidationError({"end": ["Must differ from start."]})
        return {"start": start, "end": end}


class PreferencesSerializer(serializers.Serializer):
    """A recipient's whole preferences, as in API.md; PUT replaces them."""

    opted_out = serializers.BooleanField(default=False)
    channels = serializers.DictField(child=serializers.BooleanField(), default=dict)
    categories = serializers.DictField(child=CategoryPrefSerializer(), default=dict)
    quiet_hours = QuietHoursSerializer(required=False, allow_null=True, default=None)

    def validate_channels(self, value: dict[str, bool]) -> dict[str, bool]:
        unknown = sorted(set(value) - set(settings.CHANNELS))
        if unknown:
            raise serializers.ValidationError({key: ["Unknown channel."] for key in unknown})
        return value

    def validate_categories(self, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        errors: dict[str, list[str]] = {}
        cleaned: dict[str, dict[str, Any]] = {}
        for category, prefs in value.items():
            if category not in settings.NOTIFIER_CATEGORIES:
                errors[category] = ["Unknown category."]
                continue
            if not is_optional(category):
                if not prefs["enabled"]:
                    errors[category] = ["This category cannot be switched off."]
                    continue
                if prefs.get("channels") is not None or prefs["frequency"] != "immediate":
                    errors[category] = ["This category is always sent immediately on every channel."]
                    continue
            cleaned[category] = {k: v for k, v in prefs.items() if v is not None}
        if errors:
            raise serializers.ValidationError(errors)
        return cleaned


class PreferencesApi(APIView):
    """GET shows a recipient's preferences; PUT replaces them."""

    required_scopes = RECIPIENT_SCOPES

    def get(self, request: Request, user_id: str) -> Response:
        return Response(selectors.recipient_preferences(recipient=_recipient_or_404(user_id)))

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
        return Response(selectors.recipient_preferences(recipient=recipient))


class PreferenceLinkInputSerializer(serializers.Serializer):
    """How long a preference-center link stays valid."""

    ttl_seconds = serializers.IntegerField(
        min_value=60,
        max_value=settings.PREFERENCE_LINK_MAX_TTL_SECONDS,
        default=settings.PREFERENCE_LINK_TTL_SECONDS,
    )


class PreferenceLinkOutputSerializer(serializers.Serializer):
    """A preference-center link and when it stops working."""

    url = serializers.URLField()
    expires_at = serializers.DateTimeField()


class PreferenceLinkApi(APIView):
    """POST mints a signed, expiring link to the recipient's preference center (no login needed to open it)."""

    required_scope = "recipients:write"

    @extend_schema(request=PreferenceLinkInputSerializer, responses={200: PreferenceLinkOutputSerializer})
    def post(self, request: Request, user_id: str) -> Response:
        recipient = _recipient_or_404(user_id)
        data = PreferenceLinkInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        url, expires_at = services.preference_link(recipient=recipient, ttl_seconds=data.validated_data["ttl_seconds"])
        return Response(PreferenceLinkOutputSerializer({"url": url, "expires_at": expires_at}).data)


# --- Suppressions ------------------------------------------------------------------------------------------


class SuppressionInputSerializer(serializers.Serializer):
    """An address to stop sending to on a channel."""

    channel = serializers.ChoiceField(choices=settings.CHANNELS)
    address = serializers.CharField(max_length=4096)
    reason = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")


class SuppressionOutputSerializer(serializers.Serializer):
    """A suppression-list entry."""

    id = serializers.IntegerField()
    channel = serializers.CharField()
    address = serializers.CharField()
    reason = serializers.CharField()
    # A field named like Field.source: the serializer metaclass moves it into _declared_fields at run time.
    source = serializers.CharField()  # type: ignore[assignment]
    created_at = serializers.DateTimeField()


class SuppressionFilterSerializer(serializers.Serializer):
    """Query parameters of the suppression list."""

    channel = serializers.ChoiceField(choices=settings.CHANNELS, required=False)
    address = serializers.CharField(max_length=4096, required=False)
    cursor = serializers.CharField(required=False)
    limit = serializers.IntegerField(min_value=1, max_value=PAGE_MAX, default=PAGE_DEFAULT)


class SuppressionListApi(APIView):
    """GET pages the suppression list by keyset cursor; POST adds an address (idempotent)."""

    required_scope = "suppressions"

    def get(self, request: Request) -> Response:
        params = SuppressionFilterSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        q = params.validated_data
        after = _decode_cursor(q["cursor"]) if q.get("cursor") else 0
        rows = selectors.suppression_list(
            channel=q.get("channel"), address=q.get("address"), after_id=after, limit=q["limit"] + 1
        )
        page, more = rows[: q["limit"]], len(rows) > q["limit"]
        return Response(
            {
                "results": SuppressionOutputSerializer(page, many=True).data,
                "next_cursor": _encode_cursor(page[-1].pk) if more else None,
            }
        )

    def post(self, request: Request) -> Response:
        data = SuppressionInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        existed = selectors.suppression_exists(
            channel=data.validated_data["channel"], address=data.validated_data["address"]
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

    def delete(self, request: Request, suppression_id: int) -> Response:
        suppression = selectors.suppression_get(suppression_id=suppression_id)
        if suppression is None:
            raise _not_found("Suppression")
        services.suppression_remove(suppression=suppression, audit_actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- Topics ------------------------------------------------------------------------------------------------


class TopicInputSerializer(serializers.Serializer):
    """A topic's display name."""

    name = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")


class TopicOutputSerializer(serializers.Serializer):
    """A topic with its subscriber count."""

    key = serializers.CharField()
    name = serializers.CharField()
    subscribers = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    def get_subscribers(self, obj: Topic) -> int:
        return selectors.topic_subscriber_count(topic=obj)


class TopicApi(APIView):
    """PUT creates or renames a topic; GET shows it with its subscriber count."""

    required_scope = "topics"

    def put(self, request: Request, key: str) -> Response:
        if len(key) > 128:
            raise ApiError(400, "invalid", "Topic key is too long.", {"key": ["At most 128 characters."]})
        data = TopicInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        topic, created = services.topic_upsert(key=key, name=data.validated_data["name"])
        return Response(
            TopicOutputSerializer(topic).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )

    def get(self, request: Request, key: str) -> Response:
        return Response(TopicOutputSerializer(_topic_or_404(key)).data)


class SubscribersInputSerializer(serializers.Serializer):
    """User ids to subscribe, at most 10,000 per call."""

    user_ids = serializers.ListField(
        child=serializers.CharField(max_length=255), allow_empty=False, max_length=MAX_SUBSCRIBERS_PER_CALL
    )


class TopicSubscribersApi(APIView):
    """POST subscribes user ids to a topic in bulk, creating unknown recipients."""

    required_scope = "topics"

    def post(self, request: Request, key: str) -> Response:
        topic = _topic_or_404(key)
        data = SubscribersInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        added = services.topic_subscribe(topic=topic, user_ids=data.validated_data["user_ids"])
        return Response({"added": added, "total": selectors.topic_subscriber_count(topic=topic)})


class TopicSubscriberApi(APIView):
    """DELETE unsubscribes one user id from a topic."""

    required_scope = "topics"

    def delete(self, request: Request, key: str, user_id: str) -> Response:
        services.topic_unsubscribe(topic=_topic_or_404(key), user_id=user_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
