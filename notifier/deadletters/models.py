"""Dead letters: deliveries that exhausted their retries or could not be sent at all, kept for replay."""

from __future__ import annotations

from django.db import models

from notifier.deliveries.models import Delivery
from projects.scoping import OwnedManager


class DeadLetter(models.Model):
    """A delivery that exhausted its attempts (or whose message was poison): the operator's work item."""

    class Status(models.TextChoices):
        PENDING = "pending"
        REPLAYED = "replayed"
        DISCARDED = "discarded"

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="dead_letters", db_constraint=False)
    channel = models.CharField(max_length=16)
    queue = models.CharField(max_length=64)
    reason = models.CharField(max_length=255)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    resolved_by = models.CharField(max_length=255, blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OwnedManager("delivery__environment_id")

    class Meta:
        db_table = "notifier_deadletter"
        indexes = [models.Index(fields=["status", "-created_at"], name="deadletter_status_idx")]

    def __str__(self) -> str:
        return f"dead letter #{self.pk} ({self.channel}, {self.status})"
