"""Input and output serializers of the notifications API (docs/api.md, "Notifications")."""

from __future__ import annotations

import re
from datetime import UTC, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.errors import ApiError, exception_handler
from core.keys import KEY
from core.lean import lean_validator, refuses_unknown_keys
from core.openapi import ErrorDetailSerializer
from core.pagination import CursorQuerySerializer, cursor_page_serializer
from core.serializers import JsonObjectField, validate_with
from notifier.accepting.services import AcceptResult
from notifier.clients.models import ApiClient
from notifier.deliveries.fallback import MAX_AFTER_SECONDS, STRATEGIES
from notifier.deliveries.fallback import UNTIL as FALLBACK_UNTIL
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.partitions import hot_days
from notifier.dispatch.localtime import parse_wall_clock
from preferences.serializers import ChatAddressesField

# A template or workflow key (core/keys.py), optionally pinned to a version: "key@3".
TEMPLATE_SPEC = re.compile(rf"^{KEY}(@[1-9][0-9]*)?$")
LOCALE = re.compile(r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*$")
BATCH_LIMIT = 1000


class StrictSerializer(serializers.Serializer):
    """A serializer that refuses fields it does not know (a typo must not silently change a send)."""

    @refuses_unknown_keys
    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class NotificationRecipient(serializers.Serializer):
    """The single recipient of a notification: a user, or a team's chat address without a user."""

    user_id = serializers.CharField(max_length=255, required=False)
    chat = ChatAddressesField(
        required=False,
        help_text='A chat address without a user ({"slack": "#ops"}): no preferences apply. Not with user_id.',
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("user_id" in attrs) == ("chat" in attrs):
            raise serializers.ValidationError({"user_id": ["Give exactly one of 'user_id' and 'chat'."]})
        if "chat" in attrs and not attrs["chat"]:
            raise serializers.ValidationError({"chat": ["Give at least one chat address."]})
        return attrs


# What a send with `workflow` may not give: the workflow's steps decide it.
WORKFLOW_DECIDES = ("channels", "send_at", "send_at_local", "strategy", "fallback_until", "fallback_after_seconds")


class NotificationInput(StrictSerializer):
    """The body of POST /api/v1/notifications (and each item of a batch)."""

    recipient = NotificationRecipient(
        required=False, help_text="The one recipient (a user, or a chat address); or give `topic` instead."
    )
    topic = serializers.SlugField(max_length=128, required=False, help_text="Send to a topic's subscribers.")
    category = serializers.CharField(max_length=64, required=False, help_text="Default: the template's.")
    template = serializers.CharField(
        max_length=140, required=False, help_text='Template key; "key@3" pins version 3. Or give `workflow`.'
    )
    workflow = serializers.CharField(
        max_length=140, required=False, help_text='Run a workflow instead of one template; "key@3" pins version 3.'
    )
    channels = serializers.ListField(
        child=serializers.ChoiceField(choices=settings.CHANNELS),
        required=False,
        allow_empty=False,
        max_length=len(settings.CHANNELS),
        help_text="Default: the template's channels (for a chat address: the networks it names).",
    )
    payload = JsonObjectField(required=False, default=dict, help_text="Template variables.")
    dedup_key = serializers.CharField(
        max_length=255, required=False, allow_blank=False, help_text="Idempotency key, unique per API client."
    )
    priority = serializers.ChoiceField(
        choices=Notification.Priority.choices, required=False, help_text="Default: the category's."
    )
    locale = serializers.CharField(max_length=35, required=False, allow_blank=False)
    send_at = serializers.DateTimeField(required=False, help_text="Schedule for later.")
    send_at_local = serializers.CharField(
        max_length=32, required=False, help_text="Wall-clock time (no offset) in each recipient's own time zone."
    )
    # Smarter delivery (notifier/deliveries/fallback.py).
    strategy = serializers.ChoiceField(choices=STRATEGIES, required=False)
    fallback_until = serializers.ChoiceField(choices=FALLBACK_UNTIL, required=False)
    fallback_after_seconds = serializers.IntegerField(min_value=1, max_value=MAX_AFTER_SECONDS, required=False)

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

    def validate_workflow(self, value: str) -> str:
        if not TEMPLATE_SPEC.match(value):
            raise serializers.ValidationError("Expected a workflow key, optionally pinned: 'key' or 'key@3'.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("recipient" in attrs) == ("topic" in attrs):
            raise serializers.ValidationError({"recipient": ["Give exactly one of 'recipient' and 'topic'."]})
        if ("template" in attrs) == ("workflow" in attrs):
            raise serializers.ValidationError({"template": ["Give exactly one of 'template' and 'workflow'."]})
        chat = attrs.get("recipient", {}).get("chat")
        if chat:
            if "workflow" in attrs:
                raise serializers.ValidationError({"recipient": ["A workflow runs for a user, not a chat address."]})
            if "send_at_local" in attrs:
                raise serializers.ValidationError({"send_at_local": ["A chat address has no time zone: use send_at."]})
            if "channels" not in attrs:
                # A send to a team's channel goes to the networks it names.
                attrs["channels"] = [c for c in settings.CHANNELS if c in chat]
        if "workflow" in attrs:
            # A workflow's steps decide channels, templates and timing.
            stray = [name for name in WORKFLOW_DECIDES if name in attrs]
            if stray:
                raise serializers.ValidationError({name: ["Not with 'workflow': its steps decide."] for name in stray})
        if "send_at_local" in attrs and "send_at" in attrs:
            raise serializers.ValidationError({"send_at_local": ["Give send_at or send_at_local, not both."]})
        if attrs.get("strategy") != "fallback":
            stray = [name for name in ("fallback_until", "fallback_after_seconds") if name in attrs]
            if stray:
                raise serializers.ValidationError({name: ["Only with strategy 'fallback'."] for name in stray})
        return attrs


# The common send, validated by NotificationInput's own declaration without DRF's machinery (core/lean.py): a
# field's DRF validation cost more than the rest of a batch item's accept. None: NotificationInput validates the
# body itself and words the error.
send_input_fast = lean_validator(NotificationInput)


def send_input(data: Any) -> dict[str, Any]:
    """Validate the body of a send as NotificationInput does (the same values, the same errors), faster."""
    found = send_input_fast(data)
    return found if found is not None else validate_with(NotificationInput, data)


@extend_schema_field(NotificationInput(many=True))
class BatchItemsField(serializers.ListField):
    """The batch's items, passed through as they are: each is validated on its own by the view."""


class BatchInput(serializers.Serializer):
    """The body of POST /api/v1/notifications/batch: up to 1,000 notifications, each validated on its own.

    Only the list is checked here; the view validates each item with NotificationInput so that a bad item is
    its own 400 in the results instead of failing the whole batch.
    """

    notifications = BatchItemsField(
        allow_empty=False,
        max_length=BATCH_LIMIT,
        error_messages={
            "required": "Expected a list.",
            "null": "Expected a list.",
            "not_a_list": "Expected a list.",
            "empty": "Expected a list.",
            "max_length": f"At most {BATCH_LIMIT} items per batch.",
        },
        help_text=f"Up to {BATCH_LIMIT} items, each a NotificationInput.",
    )


class NotificationFilterSerializer(CursorQuerySerializer):
    """Query parameters of GET /api/v1/notifications."""

    user_id = serializers.CharField(required=False, allow_blank=True)
    status = serializers.CharField(required=False, allow_blank=True, help_text="A notification status.")
    category = serializers.CharField(required=False, allow_blank=True)

    def validate_status(self, value: str) -> str:
        if value and value not in Notification.Status.values:
            raise serializers.ValidationError("Unknown status.")
        return value


# --- Output ------------------------------------------------------------------------------------------------

MODE_HELP = (
    'The mode of the key that sent it: "test" deliveries all go to the sandbox provider, "live" ones to the'
    " configured providers."
)


class DeliveryEventSerializer(serializers.Serializer):
    """One entry of a delivery's status history."""

    status = serializers.CharField()
    detail = serializers.CharField()
    at = serializers.DateTimeField()


class DeliverySummarySerializer(serializers.Serializer):
    """A delivery as the answer to a send lists it."""

    id = serializers.IntegerField(source="pk")
    channel = serializers.CharField()
    status = serializers.CharField()
    reason = serializers.CharField()


class DeliveryDetailSerializer(DeliverySummarySerializer):
    """A delivery with its provider, attempts and status history; SMS deliveries add encoding and segments."""

    provider = serializers.CharField()
    provider_message_id = serializers.CharField()
    attempts = serializers.IntegerField()
    last_error = serializers.CharField()
    template_version = serializers.IntegerField(source="template_version_id", allow_null=True)
    not_before = serializers.DateTimeField(allow_null=True)
    sent_at = serializers.DateTimeField(allow_null=True)
    events = DeliveryEventSerializer(many=True, source="events.all")
    encoding = serializers.CharField(
        source="sms_encoding", allow_null=True, required=False, help_text="SMS only: gsm7 or ucs2."
    )
    segments = serializers.IntegerField(source="sms_segments", allow_null=True, required=False, help_text="SMS only.")

    def to_representation(self, instance: Delivery) -> dict[str, Any]:
        body = super().to_representation(instance)
        if instance.channel != "sms":
            del body["encoding"], body["segments"]
        else:
            body["encoding"] = body["encoding"] or None
        return body


# The steps of a send with `workflow`, as its answers show them (the workflows app fills them in).
class WorkflowStepDelivery(serializers.Serializer):
    """A delivery a send step created."""

    id = serializers.IntegerField()
    channel = serializers.CharField()
    status = serializers.CharField()
    reason = serializers.CharField(allow_blank=True)


class WorkflowStepOutput(serializers.Serializer):
    """One step of a run: where it is and why."""

    id = serializers.CharField()
    type = serializers.CharField()
    status = serializers.ChoiceField(
        choices=["pending", "waiting", "done", "skipped", "merged", "throttled", "failed", "cancelled"]
    )
    reason = serializers.CharField(allow_blank=True)
    at = serializers.DateTimeField(allow_null=True)
    notification_id = serializers.CharField(required=False, allow_null=True)
    deliveries = WorkflowStepDelivery(many=True, required=False)


class NotificationWorkflowOutput(serializers.Serializer):
    """What a notification sent with `workflow` adds to its answers (the send's and the read's).

    Answers of any other send leave every one of these fields out (`required=False`, so the schema does not
    require them either); a user's run has `run_status` and `steps`, a topic's `runs`.
    """

    workflow = serializers.CharField(required=False, read_only=True, help_text="Sent with `workflow`: its key.")
    workflow_version = serializers.IntegerField(required=False, read_only=True)
    run_status = serializers.CharField(required=False, read_only=True, help_text="A user's run: its status.")
    steps = WorkflowStepOutput(many=True, required=False, read_only=True, help_text="A user's run: every step.")
    runs = serializers.DictField(
        child=serializers.IntegerField(), required=False, read_only=True, help_text="A topic's runs per status."
    )


class AcceptOutput(NotificationWorkflowOutput):
    """The answer to an accepted (or duplicate) send; for a topic, `topic` and, once fanned out, its total."""

    id = serializers.CharField(source="notification.pk")
    status = serializers.SerializerMethodField(help_text='Always "accepted".')
    duplicate = serializers.BooleanField(help_text="True when this repeats an earlier request's dedup_key.")
    deliveries = DeliverySummarySerializer(many=True, help_text="Empty for a topic: fan-out creates them.")
    topic = serializers.CharField(source="notification.topic.key", allow_null=True, required=False)
    recipients_total = serializers.IntegerField(source="notification.recipients_total", required=False)
    mode = serializers.ChoiceField(
        choices=ApiClient.Mode.choices, source="notification.client.mode", read_only=True, help_text=MODE_HELP
    )

    def get_status(self, result: AcceptResult) -> str:
        return "accepted"

    def to_representation(self, instance: AcceptResult) -> dict[str, Any]:
        body = super().to_representation(instance)
        n = instance.notification
        if not n.topic_id:
            del body["topic"], body["recipients_total"]
        elif n.recipients_total is None:
            del body["recipients_total"]
        return body


def accept_answer(result: AcceptResult) -> dict[str, Any]:
    """Return AcceptOutput's answer for `result`, built as a plain dict: the answer of every accepted send.

    AcceptOutput stays the schema and the reference (a test holds the two equal); DRF's field-by-field
    rendering of it cost as much as the rest of the view.
    """
    n = result.notification
    body: dict[str, Any] = {
        "id": str(n.pk),
        "status": "accepted",
        "duplicate": bool(result.duplicate),
        "deliveries": [
            {"id": int(d.pk), "channel": str(d.channel), "status": str(d.status), "reason": str(d.reason)}
            for d in result.deliveries
        ],
    }
    if n.topic_id:
        body["topic"] = n.topic.key if n.topic is not None else None
        if n.recipients_total is not None:
            body["recipients_total"] = int(n.recipients_total)
    body["mode"] = str(n.client.mode)
    return body


class BatchItemOutput(serializers.Serializer):
    """One batch result, in the item's place: an accepted send or the error that item alone would have had."""

    status = serializers.IntegerField(help_text="The HTTP status this item would have had alone: 202, 200 or 4xx.")
    id = serializers.CharField(required=False)
    duplicate = serializers.BooleanField(required=False)
    mode = serializers.ChoiceField(choices=ApiClient.Mode.choices, required=False, help_text=MODE_HELP)
    deliveries = DeliverySummarySerializer(many=True, required=False)
    topic = serializers.CharField(allow_null=True, required=False)
    recipients_total = serializers.IntegerField(required=False)
    error = ErrorDetailSerializer(required=False)

    def to_representation(self, instance: AcceptResult | Exception) -> dict[str, Any]:
        # An error goes through the API's one exception handler, so an item's error reads as a whole call's would.
        if isinstance(instance, Exception):
            response = exception_handler(instance, {})
            assert response is not None
            return {**response.data, "status": response.status_code}
        return {**accept_answer(instance), "status": 200 if instance.duplicate else 202}


class BatchOutput(serializers.Serializer):
    """The answer to a batch: one result per item, in order."""

    results = BatchItemOutput(many=True)


class FanoutProgressSerializer(serializers.Serializer):
    """How far a topic's fan-out has come."""

    processed = serializers.IntegerField(source="fanout_processed")
    done = serializers.SerializerMethodField()

    def get_done(self, n: Notification) -> bool:
        return n.status != Notification.Status.FANNING_OUT


class NotificationOutput(serializers.Serializer):
    """A notification; fallback fields with strategy "fallback", fan-out fields for a topic."""

    id = serializers.CharField(source="pk")
    status = serializers.CharField()
    category = serializers.CharField()
    template = serializers.CharField(source="template_key")
    template_version = serializers.IntegerField(allow_null=True)
    channels = serializers.ListField(child=serializers.CharField())
    priority = serializers.CharField()
    user_id = serializers.SerializerMethodField()
    topic = serializers.SerializerMethodField()
    dedup_key = serializers.CharField(allow_null=True)
    send_at = serializers.DateTimeField(allow_null=True)
    send_at_local = serializers.SerializerMethodField()
    strategy = serializers.CharField()
    mode = serializers.ChoiceField(
        choices=ApiClient.Mode.choices, source="client.mode", read_only=True, help_text=MODE_HELP
    )
    created_at = serializers.DateTimeField()
    trace_id = serializers.CharField()
    fallback_until = serializers.CharField(required=False)
    fallback_after_seconds = serializers.IntegerField(required=False, allow_null=True)
    recipients_total = serializers.IntegerField(required=False, allow_null=True)
    fanout = FanoutProgressSerializer(source="*", required=False)

    def get_user_id(self, n: Notification) -> str | None:
        return n.user_id or None

    def get_topic(self, n: Notification) -> str | None:
        return n.topic.key if n.topic_id and n.topic else None

    def get_send_at_local(self, n: Notification) -> str | None:
        return n.send_at_local or None

    def to_representation(self, instance: Notification) -> dict[str, Any]:
        body = super().to_representation(instance)
        if instance.strategy != "fallback":
            del body["fallback_until"], body["fallback_after_seconds"]
        if not instance.topic_id:
            del body["recipients_total"], body["fanout"]
        return body


class NotificationDetailOutput(NotificationOutput, NotificationWorkflowOutput):
    """A notification with its first deliveries (and their history) and the count of deliveries per status.

    Sent with `workflow`, the view adds NotificationWorkflowOutput's fields.
    """

    deliveries = DeliveryDetailSerializer(many=True, source="first_deliveries")
    delivery_counts = serializers.SerializerMethodField(help_text="Deliveries per status.")

    def get_delivery_counts(self, n: Notification) -> dict[str, int]:
        return self.context["delivery_counts"]


class CancelOutput(serializers.Serializer):
    """How many deliveries a cancel stopped."""

    id = serializers.CharField(source="notification.pk")
    cancelled = serializers.IntegerField()


NotificationPage = cursor_page_serializer(NotificationOutput, name="NotificationPage")


# --- Statistics --------------------------------------------------------------------------------------------

STATS_GROUP_KEYS = ("day", "channel", "status", "template", "client")
# What an empty group_by means: every key but `client` (the answer callers had before it existed).
STATS_DEFAULT_GROUP = ("day", "channel", "status", "template")


class StatsQuerySerializer(serializers.Serializer):
    """Query parameters of GET /stats: the UTC days (both included), whose deliveries, how to group, which mode."""

    # `from` is a Python keyword: the field is added under that name below the class.
    to = serializers.DateField(required=False, help_text="Last UTC day counted (YYYY-MM-DD); default: today.")
    group_by = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=64,
        help_text="Comma-separated, any of day, channel, status, template, client; default the first four.",
    )
    scope = serializers.ChoiceField(
        choices=[("client", "client"), ("project", "project")],
        required=False,
        default="client",
        help_text="client (default): the calling key's deliveries; project: every key's of its project environment.",
    )
    mode = serializers.ChoiceField(
        choices=ApiClient.Mode.choices, required=False, help_text="Only notifications sent in this mode."
    )

    def validate_group_by(self, value: str) -> list[str]:
        keys = [k.strip() for k in value.split(",") if k.strip()]
        unknown = [k for k in keys if k not in STATS_GROUP_KEYS]
        if unknown:
            raise serializers.ValidationError(
                f"Unknown group_by key(s): {', '.join(unknown)}. Known: {', '.join(STATS_GROUP_KEYS)}."
            )
        # In the answer's order, each once; nothing asked means every key.
        return [k for k in STATS_GROUP_KEYS if k in keys] or list(STATS_DEFAULT_GROUP)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Fill in the defaults; refuse a backwards or future range and days that have left the hot window."""
        today = timezone.now().astimezone(UTC).date()
        last = attrs.get("to") or today
        first = attrs.get("from") or last
        if first > last:
            raise serializers.ValidationError({"from": ["Must not be after to."]})
        if last > today:
            raise serializers.ValidationError({"to": [f"Must be {today} or earlier (UTC)."]})
        oldest = today - timedelta(days=hot_days() - 1)
        if first < oldest:
            archived_to = min(last, oldest - timedelta(days=1))
            days = str(first) if first == archived_to else f"{first} to {archived_to}"
            message = (
                f"Days {days} are archived (older than the {hot_days()}-day hot window, which starts at {oldest});"
                f" ask for from={oldest} or later."
            )
            raise ApiError(400, "days_archived", message, {"from": [message]})
        return {**attrs, "from": first, "to": last, "group_by": attrs.get("group_by") or list(STATS_DEFAULT_GROUP)}


StatsQuerySerializer._declared_fields["from"] = serializers.DateField(
    required=False, help_text="First UTC day counted (YYYY-MM-DD); default: the `to` day."
)


class StatsRowSerializer(serializers.Serializer):
    """The deliveries of one group; only the keys asked for in `group_by` are present."""

    day = serializers.DateField(required=False)
    channel = serializers.CharField(required=False)
    status = serializers.CharField(required=False)
    template = serializers.CharField(required=False)
    client = serializers.CharField(required=False, help_text="The name of the API key that sent them.")
    count = serializers.IntegerField()


class StatsOutput(serializers.Serializer):
    """Counts of the client's deliveries per group, for the days `from`..`to` (both included)."""

    results = StatsRowSerializer(many=True)
    to = serializers.DateField()


StatsOutput._declared_fields["from"] = serializers.DateField()
