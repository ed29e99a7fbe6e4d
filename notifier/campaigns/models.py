"""Campaigns: a template sent to a topic's subscribers once, at a time or in the recipients' local time."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models

from notifier.clients.models import ApiClient
from projects.scoping import OwnedManager


class Campaign(models.Model):
    """A marketer's send of a template to a topic, once at a time or on a schedule, at a capped rate."""

    class Status(models.TextChoices):
        DRAFT = "draft"
        SCHEDULED = "scheduled"
        RUNNING = "running"
        PAUSED = "paused"
        DONE = "done"
        CANCELLED = "cancelled"

    name = models.CharField(max_length=255)
    client = models.ForeignKey(ApiClient, on_delete=models.PROTECT, related_name="campaigns")
    template_key = models.CharField(max_length=128)
    topic = models.ForeignKey("preferences.Topic", on_delete=models.PROTECT, related_name="campaigns")
    category = models.CharField(max_length=64, default="marketing")
    channels = ArrayField(models.CharField(max_length=16), default=list, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    send_at = models.DateTimeField(null=True, blank=True)
    crontab = models.CharField(max_length=128, blank=True, default="")  # "m h dom mon dow", recurring
    # The IANA time zone the crontab runs in (and the admin's send time is read in), e.g. "Europe/Berlin".
    timezone = models.CharField(max_length=64, default="UTC", db_default="UTC")
    # Instead of send_at: a wall-clock time ("2026-12-01T09:00:00", no offset) in each subscriber's own time
    # zone (notifier/dispatch/localtime.py); `timezone` above stands in for subscribers who have none.
    send_at_local = models.CharField(max_length=32, blank=True, default="", db_default="")
    rate_per_second = models.PositiveIntegerField(default=100)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT)
    periodic_task = models.OneToOneField(
        "django_celery_beat.PeriodicTask", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    last_run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OwnedManager("client__environment_id")

    class Meta:
        db_table = "notifier_campaign"
        permissions = [
            ("pause_campaign", "Can pause a campaign"),
            ("resume_campaign", "Can resume a paused campaign"),
            ("cancel_campaign", "Can cancel a campaign (its unsent messages are dropped)"),
        ]

    def __str__(self) -> str:
        return self.name
