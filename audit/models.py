"""One row per change made through the API or the admin; never updated, never deleted by the app."""

from __future__ import annotations

from django.db import models


class AuditEntry(models.Model):
    """Who (an API client, a staff user, a recipient through a signed link, the system) changed what, and when.

    `changes` maps each changed field to `[before, after]`, with personal data masked; `target_type` and
    `target_id` name the object (for example `recipient` / `u-42`), without a foreign key, so the entry
    outlives an erased or deleted object.
    """

    class ActorType(models.TextChoices):
        CLIENT = "client"
        STAFF = "staff"
        RECIPIENT = "recipient"
        SYSTEM = "system"

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    actor_id = models.CharField(max_length=64, blank=True, default="")
    actor_name = models.CharField(max_length=150, blank=True, default="")
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=255, blank=True, default="")
    changes = models.JSONField(default=dict, blank=True)

    class Meta:
        verbose_name = "audit entry"
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["target_type", "target_id", "-at"], name="audit_target_idx")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_type}:{self.actor_name} {self.action} {self.target_id}"
