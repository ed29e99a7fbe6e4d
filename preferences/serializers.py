"""Input and output serializers of the recipients, preferences, topics and suppressions API (docs/api.md)."""

from __future__ import annotations

import datetime as dt
import functools
import re
import zoneinfo
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.categories import is_optional
from core.chat import CHAT_CHANNELS, slack_address_error, telegram_address_error
from core.lean import GIVE_UP, lean_validator
from core.openapi import ErrorDetailSerializer
from core.pagination import CursorQuerySerializer, PageLimitField, cursor_page_serializer
from core.serializers import thread_serializer
from core.ssrf import url_refusal
from preferences import selectors
from preferences.compliance import FREQUENCIES
from preferences.models import Recipient, Topic
from preferences.phones import InvalidPhoneNumber, phone_normalize

# BCP 47 in the shape callers send it ("de", "de-DE", "zh-Hant-TW"); underscores are accepted and normalised.
LOCALE = re.compile(r"^[A-Za-z]{2,3}(?:-[A-Za-z0-9]{1,8})*$")
HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")
MAX_SUBSCRIBERS_PER_CALL = 10_000


@functools.cache
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def chat_address_error(network: str, value: str) -> tuple[str, str | None]:
    """Return the address as stored and why it is refused (None when it is valid) for one chat network."""
    if network == "slack":
        return value, slack_address_error(value)
    if network == "telegram":
        return value, telegram_address_error(value)
    if network == "whatsapp":
        try:
            return phone_normalize(value), None
        except InvalidPhoneNumber as exc:
            return value, f"{exc} Expected E.164 such as +4915112345678."
    # Teams and Discord: an incoming-webhook URL, judged by the SSRF guard as a webhook target is.
    reason = url_refusal(value, allow_private=settings.WEBHOOK_ALLOW_PRIVATE_TARGETS)
    if reason:
        return value, f"Must be an http(s) webhook URL the service may reach ({reason})."
    return value, None


@extend_schema_field(
    {
        "type": "object",
        "properties": {network: {"type": "string", "maxLength": 2048} for network in CHAT_CHANNELS},
        "additionalProperties": False,
    }
)
class ChatAddressesField(serializers.Field):
    """A recipient's chat addresses by network; each is checked for its network, "" or null removes one."""

    default_error_messages = {"invalid": "Expected an object of chat addresses by network."}

    def to_internal_value(self, data: Any) -> dict[str, str]:
        if not isinstance(data, dict):
            self.fail("invalid")
        errors: dict[str, list[str]] = {}
        addresses: dict[str, str] = {}
        for network, value in data.items():
            if network not in CHAT_CHANNELS:
                errors[str(network)] = [f"Unknown chat network; known: {', '.join(CHAT_CHANNELS)}."]
                continue
            if value is None or value == "":
                continue
            if not isinstance(value, str) or len(value) > 2048 or value != value.strip() or "\x00" in value:
                errors[network] = ["Must be a string of at most 2048 characters."]
                continue
            stored, error = chat_address_error(network, value)
            if error:
                errors[network] = [error]
            else:
                addresses[network] = stored
        if errors:
            raise serializers.ValidationError(errors)
        return addresses

    def to_representation(self, value: Any) -> dict[str, str]:
        return dict(value or {})

    def validate_empty_values(self, data: Any) -> tuple[bool, Any]:
        if data is None:
            return True, {}
        return super().validate_empty_values(data)

    def lean(self, value: Any) -> Any:
        """Return {} for addresses cleared (null or {}), else GIVE_UP: an address is its network's to check."""
        return {} if value is None or (type(value) is dict and not value) else GIVE_UP


class RecipientInputSerializer(serializers.Serializer):
    """Contact data of a recipient; fields left out keep their current value, null or "" clears them."""

    email = serializers.EmailField(max_length=320, required=False, allow_blank=True, allow_null=True)
    phone = serializers.CharField(max_length=32, required=False, allow_blank=True, allow_null=True)
    locale = serializers.CharField(max_length=35, required=False, allow_blank=True, allow_null=True)
    timezone = serializers.CharField(max_length=64, required=False, allow_blank=True, allow_null=True)
    webhook_url = serializers.URLField(max_length=2048, required=False, allow_blank=True, allow_null=True)
    chat = ChatAddressesField(required=False, allow_null=True)
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


MAX_RECIPIENTS_PER_BATCH = 1000
MAX_TOPICS_PER_ITEM = 100


class RecipientBatchItemSerializer(RecipientInputSerializer):
    """One recipient of a batch or an import: its user id, the fields a PUT takes (its validators), topics to join.

    A subclass of the PUT's serializer: every field the PUT learns, a batch item takes too, checked the same way.
    """

    user_id = serializers.CharField(max_length=255)
    topics = serializers.ListField(
        child=serializers.SlugField(max_length=128), required=False, max_length=MAX_TOPICS_PER_ITEM
    )


# The common batch item checked by the serializer's own declaration without DRF's machinery (core/lean.py): its
# fields' DRF validation was four fifths of a batch's CPU. None: the serializer validates the item and words its
# error. Phone numbers are the PUT's check (cached per text).
recipient_item_fast = lean_validator(RecipientBatchItemSerializer)


@extend_schema_field(RecipientBatchItemSerializer(many=True))
class BatchItemsField(serializers.ListField):
    """The items of a batch, each an object checked on its own later (a bad item fails alone, not the call)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            child=serializers.JSONField(), allow_empty=False, max_length=MAX_RECIPIENTS_PER_BATCH, **kwargs
        )

    def run_child_validation(self, data: list[Any]) -> list[Any]:
        # The child JSONField returns an item as it is, after checking that json.dumps takes it: a parsed JSON
        # body (nested at most core.bodies.MAX_JSON_DEPTH deep) always is, so only a null item (which it
        # refuses, failing the call) needs it.
        if None in data:
            return super().run_child_validation(data)
        return list(data)


class RecipientBatchInputSerializer(serializers.Serializer):
    """Up to 1,000 recipients to create or update, each as `PUT /recipients/{user_id}` takes it, plus `user_id`."""

    recipients = BatchItemsField()


class RecipientBatchResultSerializer(serializers.Serializer):
    """What became of one item: 201 created, 200 updated, 400 refused (with the error)."""

    user_id = serializers.CharField(allow_null=True)
    status = serializers.ChoiceField(choices=[201, 200, 400])
    error = ErrorDetailSerializer(required=False)


class RecipientBatchOutputSerializer(serializers.Serializer):
    """One result per item, in the order sent."""

    results = RecipientBatchResultSerializer(many=True)


_WRITTEN = (200, 201)


def recipient_batch_answer(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Return `RecipientBatchOutputSerializer({"results": results}).data`, with the serializer only for errors.

    A result without an error ({"user_id": str, "status": 201 or 200}) is what the serializer makes of it;
    building 1,000 of them through its fields was a tenth of a batch's CPU.
    """
    slow = thread_serializer(RecipientBatchResultSerializer).to_representation
    plain = {"user_id", "status"}
    return {
        "results": [
            dict(result)
            if result.keys() == plain and type(result["user_id"]) is str and result["status"] in _WRITTEN
            else dict(slow(result))
            for result in results
        ]
    }


class DeviceInputSerializer(serializers.Serializer):
    """A push token to register."""

    platform = serializers.ChoiceField(choices=["fcm"], default="fcm")
    token = serializers.CharField(max_length=4096, trim_whitespace=True)


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
    """A recipient's whole preferences, as in docs/api.md; PUT replaces them."""

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


class DeviceSerializer(serializers.Serializer):
    """An active push device of a recipient."""

    platform = serializers.CharField()
    token = serializers.CharField()


class DeviceOutputSerializer(DeviceSerializer):
    """A registered push device."""

    active = serializers.BooleanField()


@extend_schema_field(serializers.DictField(child=CategoryPrefSerializer()))
class CategoryPrefsField(serializers.DictField):
    """A recipient's per-category settings, shown as stored (each as in CategoryPref)."""


class QuietHoursOutputSerializer(serializers.Serializer):
    """Quiet hours as "HH:MM" in the recipient's time zone."""

    start = serializers.CharField()
    end = serializers.CharField()


class PreferencesOutputSerializer(serializers.Serializer):
    """A recipient's preferences."""

    opted_out = serializers.BooleanField()
    channels = serializers.DictField(child=serializers.BooleanField())
    categories = CategoryPrefsField()
    quiet_hours = QuietHoursOutputSerializer(allow_null=True)


class RecipientOutputSerializer(serializers.Serializer):
    """A recipient as the API shows it."""

    user_id = serializers.CharField()
    email = serializers.CharField()
    phone = serializers.CharField()
    locale = serializers.CharField()
    timezone = serializers.CharField()
    webhook_url = serializers.CharField()
    chat = serializers.DictField(child=serializers.CharField(), help_text="Chat addresses by network.")
    tracking_opt_out = serializers.BooleanField()
    devices = serializers.SerializerMethodField()
    preferences = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    @extend_schema_field(DeviceSerializer(many=True))
    def get_devices(self, obj: Recipient) -> list[dict[str, Any]]:
        return DeviceSerializer(selectors.recipient_device_tokens(recipient=obj), many=True).data  # type: ignore[return-value]  # many=True gives a ListSerializer: .data is a list, the stubs say a dict

    @extend_schema_field(PreferencesOutputSerializer)
    def get_preferences(self, obj: Recipient) -> dict[str, Any]:
        return PreferencesOutputSerializer(selectors.recipient_preferences(recipient=obj)).data


class RecipientListQuerySerializer(CursorQuerySerializer):
    """Query parameters of the recipient list: exact email or phone, normalised as a recipient's own are."""

    email = serializers.EmailField(max_length=320, required=False, allow_blank=True)
    phone = serializers.CharField(max_length=32, required=False, allow_blank=True)

    def validate_phone(self, value: str) -> str:
        return RecipientInputSerializer().validate_phone(value)


class RecipientListItemSerializer(serializers.Serializer):
    """A recipient as the list shows it (`GET /recipients/{user_id}` adds devices and preferences)."""

    user_id = serializers.CharField()
    email = serializers.CharField()
    phone = serializers.CharField()
    locale = serializers.CharField()
    timezone = serializers.CharField()
    webhook_url = serializers.CharField()
    chat = serializers.DictField(child=serializers.CharField(), help_text="Chat addresses by network.")
    tracking_opt_out = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


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
    # The API field is named "source"; DRF's metaclass moves declared fields out of the class, so it does not
    # shadow Field.source at runtime, but the stubs cannot see that.
    source = serializers.CharField()  # type: ignore[assignment]
    created_at = serializers.DateTimeField()


class SuppressionFilterSerializer(CursorQuerySerializer):
    """Query parameters of the suppression list."""

    channel = serializers.ChoiceField(choices=settings.CHANNELS, required=False)
    address = serializers.CharField(max_length=4096, required=False)
    # Up to 1,000 a page, as this list allowed before every list took the same `limit`.
    limit = PageLimitField(max_value=1000)


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


class TopicListItemSerializer(serializers.Serializer):
    """A topic as the list shows it (`GET /topics/{key}` adds its subscriber count)."""

    key = serializers.CharField()
    name = serializers.CharField()
    created_at = serializers.DateTimeField()


class SubscribersInputSerializer(serializers.Serializer):
    """User ids to subscribe, at most 10,000 per call."""

    user_ids = serializers.ListField(
        child=serializers.CharField(max_length=255), allow_empty=False, max_length=MAX_SUBSCRIBERS_PER_CALL
    )


class SubscribersOutputSerializer(serializers.Serializer):
    """How many user ids a call subscribed, and the topic's subscribers now."""

    added = serializers.IntegerField()
    total = serializers.IntegerField()


SuppressionPage = cursor_page_serializer(SuppressionOutputSerializer, name="SuppressionPage")
RecipientPage = cursor_page_serializer(RecipientListItemSerializer, name="RecipientPage")
TopicPage = cursor_page_serializer(TopicListItemSerializer, name="TopicPage")
