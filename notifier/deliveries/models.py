"""Notifications and their deliveries, with the event history of every delivery's status."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex, HashIndex
from django.db import models
from django.db.models import Q

from notifier.clients.models import ApiClient
from notifier.deliveries.partitions import (
    delivery_ids_of_notification,
    new_notification_id,
    notification_range,
    uuid7_time,
)
from projects.scoping import OwnedManager, OwnedQuerySet, owner_field


def _id_bounds(value: Any, *, many: bool) -> tuple[datetime, datetime] | None:
    """Return the created_at range of one notification id or of a list of them (None when an id does not say)."""
    if value is None or isinstance(value, models.QuerySet | models.Model):
        return None
    values = list(value) if many else [value]
    ranges: list[tuple[datetime, datetime]] = []
    for v in values:
        bounds = notification_range(v)
        if bounds is None:
            return None
        ranges.append(bounds)
    if not ranges:
        return None
    return min(r[0] for r in ranges), max(r[1] for r in ranges)


class NotificationQuerySet(OwnedQuerySet["Notification"]):
    """Notifications; a filter on one id adds the created_at range its UUIDv7 implies (one partition, not all)."""

    _any_day = False

    def any_day(self) -> NotificationQuerySet:
        """Return this queryset without the id's day: for rows whose created_at was changed by hand (tests)."""
        clone = self._chain()  # type: ignore[attr-defined]  # Django's private QuerySet API is not in the stubs
        clone._any_day = True
        return clone

    def _clone(self) -> NotificationQuerySet:
        clone = super()._clone()  # type: ignore[misc]  # Django's private QuerySet API is not in the stubs
        clone._any_day = self._any_day
        return clone

    def _filter_or_exclude(self, negate: bool, args: Any, kwargs: Any) -> NotificationQuerySet:
        if not negate and not args and not self._any_day:
            for name in ("pk", "id", "pk__exact", "id__exact", "pk__in", "id__in"):
                if name in kwargs and "created_at__range" not in kwargs:
                    bounds = _id_bounds(kwargs[name], many=name.endswith("__in"))
                    if bounds is not None:
                        kwargs = {**kwargs, "created_at__range": bounds}
                    break
        return super()._filter_or_exclude(negate, args, kwargs)  # type: ignore[misc]  # private API, as above


NotificationManager = OwnedManager.from_queryset(NotificationQuerySet)


class BirthTimeField(models.DateTimeField):
    """A notification's created_at: the instant its UUIDv7 id carries, so the id always finds the row's day."""

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        born = uuid7_time(model_instance.pk) if add else None
        if born is None:
            return super().pre_save(model_instance, add)
        setattr(model_instance, self.attname, born)
        return born


class Notification(models.Model):
    """One accepted request: to a user or a topic, on some channels, from a template."""

    class Status(models.TextChoices):
        ACCEPTED = "accepted"
        SCHEDULED = "scheduled"
        FANNING_OUT = "fanning_out"
        DONE = "done"
        CANCELLED = "cancelled"

    class Priority(models.TextChoices):
        HIGH = "high"
        NORMAL = "normal"
        LOW = "low"

    # UUIDv7: the creation time leads, so an id finds its day's partition (notifier/deliveries/partitions.py).
    id = models.UUIDField(primary_key=True, default=new_notification_id, editable=False)
    # No database FK constraints to or from the partitioned hot tables
    # (docs/decisions/0009-no-foreign-keys-on-the-delivery-log.md).
    client = models.ForeignKey(ApiClient, on_delete=models.PROTECT, related_name="notifications", db_constraint=False)
    # The client's environment, kept on the row so that owned reads need no join.
    environment = owner_field(db_constraint=False)
    # NULL, not "", for "no key". Unique per client within DEDUP_WINDOW_HOURS through notifier_dedupkey
    # (notifier/deliveries/dedup.py): a unique index on a partitioned table would only see one day.
    dedup_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    # SHA-256 of the canonical request body: the same dedup_key with a different body is a 409.
    request_hash = models.CharField(max_length=64, blank=True, default="")
    category = models.CharField(max_length=64)
    template_key = models.CharField(max_length=128)
    template_version = models.PositiveIntegerField(null=True, blank=True)  # pinned with "key@N"
    channels = ArrayField(models.CharField(max_length=16), default=list)
    payload = models.JSONField(default=dict, blank=True)
    recipient = models.ForeignKey(
        "preferences.Recipient",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="notifications",
        db_constraint=False,
    )
    user_id = models.CharField(max_length=255, blank=True, default="")
    topic = models.ForeignKey(
        "preferences.Topic",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="notifications",
        db_constraint=False,
    )
    campaign = models.ForeignKey(
        "campaigns.Campaign",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="notifications",
        db_constraint=False,
    )
    priority = models.CharField(max_length=8, choices=Priority.choices)
    locale = models.CharField(max_length=35, blank=True, default="")
    send_at = models.DateTimeField(null=True, blank=True)
    # A wall-clock time without offset ("2026-12-01T09:00:00"), sent at that time in each recipient's own time
    # zone (notifier/dispatch/localtime.py); for a single recipient send_at holds the instant it resolved to.
    send_at_local = models.CharField(max_length=32, blank=True, default="", db_default="")
    # "all": every channel at once; "fallback": the channels in order, the next only if the previous did not
    # reach `fallback_until` within `fallback_after_seconds` (notifier/deliveries/fallback.py).
    strategy = models.CharField(max_length=8, default="all", db_default="all")
    fallback_until = models.CharField(max_length=16, blank=True, default="", db_default="")
    fallback_after_seconds = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACCEPTED)
    # Fan-out progress: subscribers seen so far, over all lanes (FanoutLane holds each lane's resume point).
    recipients_total = models.PositiveIntegerField(null=True, blank=True)
    fanout_processed = models.PositiveIntegerField(default=0)
    trace_id = models.CharField(max_length=32, blank=True, default="")
    # The partition key (notifier/deliveries/partitions.py).
    created_at = BirthTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Not a column: the detail's first deliveries, set by notifier.deliveries.selectors.notification_get.
    first_deliveries: list[Delivery]

    objects = NotificationManager()

    class Meta:
        db_table = "notifier_notification"
        # Related lookups (delivery.notification) go through it too, so they add the id's day as well.
        base_manager_name = "objects"
        indexes = [
            models.Index(fields=["user_id", "-created_at"], name="notification_user_idx"),
            models.Index(fields=["client", "-created_at"], name="notification_client_idx"),
            # Support's search by dedup key of any age; uniqueness is notifier_dedupkey's
            # (notifier/deliveries/dedup.py).
            models.Index(
                fields=["client", "dedup_key"], condition=Q(dedup_key__isnull=False), name="notification_dedup_idx"
            ),
            BrinIndex(fields=["created_at"], name="notification_created_brin"),
        ]

    def __str__(self) -> str:
        return f"{self.template_key} → {self.user_id or self.topic_id}"

    def day_deliveries(self) -> models.QuerySet[Delivery]:
        """Return this notification's deliveries, read from its day's partition only (all, for a non-UUIDv7 id)."""
        deliveries = self.deliveries.all()
        if uuid7_time(self.pk) is not None and self.created_at is not None:
            low, high = delivery_ids_of_notification(self.created_at)
            deliveries = deliveries.filter(id__gte=low, id__lt=high)
        return deliveries


class Delivery(models.Model):
    """One message to one address on one channel: the unit that is queued, claimed, sent and tracked.

    The row is also the outbox: a delivery still `queued` long after its last publish is published again by
    the relay, so nothing accepted depends on the broker having been up at the moment of acceptance.
    """

    class Status(models.TextChoices):
        SCHEDULED = "scheduled"
        QUEUED = "queued"
        DEFERRED = "deferred"
        SENDING = "sending"
        SENT = "sent"
        DELIVERED = "delivered"
        OPENED = "opened"
        FAILED = "failed"
        BOUNCED = "bounced"
        SUPPRESSED = "suppressed"
        CANCELLED = "cancelled"
        DIGESTED = "digested"
        # A later step of a fallback chain, waiting for the decision on the step before it.
        PENDING = "pending"
        # A fallback step no longer needed (an earlier one reached fallback_until).
        SKIPPED = "skipped"

    # Statuses after which nothing more happens to a delivery by itself (callbacks may still move it on):
    # retention may remove it, support may resend it. One list, so a new final status lands in both.
    FINAL_STATUSES = frozenset(
        {
            Status.SENT,
            Status.DELIVERED,
            Status.OPENED,
            Status.FAILED,
            Status.BOUNCED,
            Status.SUPPRESSED,
            Status.CANCELLED,
            Status.DIGESTED,
            Status.SKIPPED,
        }
    )

    id = models.BigAutoField(primary_key=True)
    # Indexed through delivery_target_uniq, whose leading column it is. No database FK constraints here or on
    # DeliveryEvent (db_constraint=False): checking them was a third of the fan-out's database time, and every
    # row is written by code that has just read its parents in the same transaction. CASCADE and PROTECT still
    # hold through the ORM, and retention deletes children before parents (docs/decisions/0009-…).
    notification = models.ForeignKey(
        Notification, on_delete=models.CASCADE, related_name="deliveries", db_index=False, db_constraint=False
    )
    # The notification's environment, kept on the row so that owned reads (the inbox, search, statistics) need no
    # join with the notifications.
    environment = owner_field(db_constraint=False)
    recipient = models.ForeignKey(
        "preferences.Recipient",
        on_delete=models.PROTECT,
        related_name="deliveries",
        db_index=False,
        db_constraint=False,
    )
    channel = models.CharField(max_length=16)
    priority = models.CharField(max_length=8)
    address = models.CharField(max_length=4096, blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    reason = models.CharField(max_length=255, blank=True, default="")
    provider = models.CharField(max_length=32, blank=True, default="")
    provider_message_id = models.CharField(max_length=255, blank=True, default="")
    # Set after an ambiguous attempt (the request may have reached this provider): every later attempt goes
    # to this provider only, whatever deferrals (open breaker, rate limit, quiet hours) come in between.
    # db_default: the fan-out and other raw INSERTs do not name this column.
    pinned_provider = models.CharField(max_length=32, blank=True, default="", db_default="")
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    # Not to be sent before this instant (send_at, quiet hours, backoff, rate limit, open breaker).
    not_before = models.DateTimeField(null=True, blank=True)
    published_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    read_at = models.DateTimeField(null=True, blank=True)
    # In-app only: archived by the recipient (out of the default inbox list, shown by `archived=true`).
    archived_at = models.DateTimeField(null=True, blank=True)
    # Indexed only where set (delivery_template_version_idx): a delivery gets its version when it is sent,
    # and a NULL entry on insert and on claim would be two index writes per delivery for nothing.
    template_version = models.ForeignKey(
        "templates_app.TemplateVersion",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    # The rendered message for channels that keep it (the in-app inbox).
    content = models.JSONField(null=True, blank=True)
    # SMS only, set when rendered on the worker: "gsm7" or "ucs2" and the segments the text is sent in.
    sms_encoding = models.CharField(max_length=8, blank=True, default="", db_default="")
    sms_segments = models.PositiveSmallIntegerField(null=True, blank=True)
    # The delivery support staff resent this one from (notifier/staff/support.py); indexed only where set.
    resent_from = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="resends",
        db_index=False,
        db_constraint=False,
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OwnedManager()

    class Meta:
        db_table = "notifier_delivery"
        verbose_name_plural = "deliveries"
        permissions = [
            ("resend_delivery", "Can resend a delivery (a new delivery, compliance checked again)"),
            ("cancel_delivery", "Can cancel a delivery that is not yet sent"),
        ]
        constraints = [
            # Fan-out writes with ON CONFLICT DO NOTHING against this, so a resumed fan-out never doubles.
            models.UniqueConstraint(
                fields=["notification", "recipient", "channel", "address"], name="delivery_target_uniq"
            )
        ]
        indexes = [
            models.Index(fields=["published_at"], condition=Q(status="queued"), name="delivery_outbox_idx"),
            models.Index(fields=["claimed_at"], condition=Q(status="sending"), name="delivery_inflight_idx"),
            models.Index(
                fields=["not_before"], condition=Q(status__in=["deferred", "scheduled"]), name="delivery_due_idx"
            ),
            models.Index(
                fields=["provider", "provider_message_id"],
                condition=~Q(provider_message_id=""),
                name="delivery_provider_msg_idx",
            ),
            models.Index(fields=["recipient", "-id"], condition=Q(channel="inapp"), name="delivery_inbox_idx"),
            # The fallback timer's sweep: the next step of a chain waits as `pending` until its not_before.
            models.Index(fields=["not_before"], condition=Q(status="pending"), name="delivery_pending_idx"),
            models.Index(fields=["recipient", "-created_at"], name="delivery_recipient_idx"),
            models.Index(
                fields=["template_version"],
                condition=Q(template_version__isnull=False),
                name="delivery_template_version_idx",
            ),
            BrinIndex(fields=["created_at"], name="delivery_created_brin"),
            # Support finds a customer's message by the address it went to (email, phone). A hash index: an
            # address may be a long webhook URL, past what a btree entry can hold; equality is all it serves.
            HashIndex(fields=["address"], condition=~Q(address=""), name="delivery_address_hash"),
            models.Index(
                fields=["resent_from"], condition=Q(resent_from__isnull=False), name="delivery_resent_from_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.channel} #{self.pk} {self.status}"


class DeliveryEvent(models.Model):
    """One status transition of a delivery; appended, never updated."""

    id = models.BigAutoField(primary_key=True)
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="events", db_constraint=False)
    status = models.CharField(max_length=16)
    detail = models.CharField(max_length=1024, blank=True, default="")
    at = models.DateTimeField()

    # Owned through its delivery: appended in the same statement as the delivery's transition, read only with it.
    objects = OwnedManager("delivery__environment_id")

    class Meta:
        db_table = "notifier_deliveryevent"
        ordering = ["id"]
        indexes = [BrinIndex(fields=["at"], name="event_at_brin")]

    def __str__(self) -> str:
        return f"#{self.delivery_id} {self.status}"
