"""Status events for the calling services: their endpoint, the events to send and each attempt to send them."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import Q

from notifier.clients.models import ApiClient
from projects.scoping import OwnedManager


class EventEndpoint(models.Model):
    """Where an API client receives the status changes of its own deliveries (one endpoint per client).

    `failures` and `retry_at` are the endpoint's backoff: while its oldest pending event keeps failing, the
    endpoint waits as a whole, so its events arrive in order and a dead receiver costs only its own queue.
    """

    client = models.OneToOneField(ApiClient, on_delete=models.CASCADE, related_name="event_endpoint")
    url = models.URLField(max_length=2048)
    # "whsec_<base64>" (Standard Webhooks); shown once on creation and on rotation.
    secret = models.CharField(max_length=128)
    # Delivery statuses that become events ("sent", "delivered", …); the API speaks "delivery.sent".
    statuses = ArrayField(models.CharField(max_length=16), default=list)
    max_batch = models.PositiveSmallIntegerField(default=1)
    is_active = models.BooleanField(default=True)
    failures = models.PositiveIntegerField(default=0)
    retry_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OwnedManager("client__environment_id")

    class Meta:
        db_table = "notifier_eventendpoint"

    def __str__(self) -> str:
        return f"{self.client} → {self.url}"


class StatusEvent(models.Model):
    """One status change of one delivery, owed to its client's event endpoint; `id` is the stable event id."""

    class State(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        GIVEN_UP = "given_up"

    id = models.BigAutoField(primary_key=True)
    # No FK constraints: written in bulk on the send path (like DeliveryEvent), by code that just read them.
    endpoint = models.ForeignKey(
        EventEndpoint, on_delete=models.CASCADE, related_name="events", db_index=False, db_constraint=False
    )
    delivery_id = models.BigIntegerField()
    type = models.CharField(max_length=32)
    # The event's `data`, fixed when the change happened (later changes to the delivery do not rewrite it).
    data = models.JSONField()
    at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    delivered_at = models.DateTimeField(null=True, blank=True)

    objects = OwnedManager("endpoint__client__environment_id")

    class Meta:
        db_table = "notifier_statusevent"
        indexes = [
            # The sender's queue: an endpoint's pending events in order.
            models.Index(fields=["endpoint", "id"], condition=Q(state="pending"), name="statusevent_pending_idx"),
            BrinIndex(fields=["at"], name="statusevent_at_brin"),
        ]

    def __str__(self) -> str:
        return f"evt_{self.pk} {self.type}"


class EventAttempt(models.Model):
    """One POST to an event endpoint (one event or a batch), or the record of events given up."""

    endpoint = models.ForeignKey(EventEndpoint, on_delete=models.CASCADE, related_name="attempts")
    first_event_id = models.BigIntegerField()
    last_event_id = models.BigIntegerField()
    events = models.PositiveIntegerField()
    ok = models.BooleanField()
    given_up = models.PositiveIntegerField(default=0)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=512, blank=True, default="")
    duration_ms = models.PositiveIntegerField(default=0)
    at = models.DateTimeField()

    objects = OwnedManager("endpoint__client__environment_id")

    class Meta:
        db_table = "notifier_eventattempt"
        indexes = [models.Index(fields=["endpoint", "-id"], name="eventattempt_endpoint_idx")]

    def __str__(self) -> str:
        return f"attempt #{self.pk} ({'ok' if self.ok else 'failed'})"
