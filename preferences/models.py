"""Recipients, their devices and preferences, topics with subscriptions, and the suppression list."""

from __future__ import annotations

from django.db import models

from projects.scoping import OwnedManager, owner_field


class Recipient(models.Model):
    """A person notifications are addressed to, known to callers by their own `user_id`."""

    environment = owner_field()

    user_id = models.CharField(max_length=255)
    email = models.CharField(max_length=320, blank=True, default="")
    phone = models.CharField(max_length=20, blank=True, default="")
    locale = models.CharField(max_length=35, blank=True, default="")
    timezone = models.CharField(max_length=64, blank=True, default="")
    webhook_url = models.URLField(max_length=2048, blank=True, default="")
    # Preferences (see docs/preferences.md): global opt-out, per-channel switches {"sms": false}, per-category settings
    # {"marketing": {"enabled": true, "channels": ["email"], "frequency": "daily_digest"}}.
    opted_out = models.BooleanField(default=False)
    # The recipient asked not to be tracked: their email gets no open pixel and untracked links.
    tracking_opt_out = models.BooleanField(default=False, db_default=False)
    channel_prefs = models.JSONField(default=dict, blank=True)
    category_prefs = models.JSONField(default=dict, blank=True)
    quiet_start = models.TimeField(null=True, blank=True)
    quiet_end = models.TimeField(null=True, blank=True)
    # Erasure keeps the row (deliveries point at it) but wipes every personal field.
    erased_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OwnedManager()

    class Meta:
        constraints = [
            # User id first: the same index serves support's search by user id across environments.
            models.UniqueConstraint(fields=["user_id", "environment"], name="recipient_user_environment_uniq")
        ]
        # Support looks a customer up by email or phone (notifier.deliveries.selectors.delivery_search).
        indexes = [
            models.Index(fields=["email"], condition=~models.Q(email=""), name="recipient_email_idx"),
            models.Index(fields=["phone"], condition=~models.Q(phone=""), name="recipient_phone_idx"),
        ]

    def __str__(self) -> str:
        return self.user_id


class Device(models.Model):
    """A push token of one of a recipient's devices."""

    # A device's own column too: its token is unique per environment, so the test and live apps of one project
    # may register the same phone.
    environment = owner_field()
    recipient = models.ForeignKey(Recipient, on_delete=models.CASCADE, related_name="devices")
    platform = models.CharField(max_length=16, default="fcm")
    token = models.CharField(max_length=4096)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    deactivated_at = models.DateTimeField(null=True, blank=True)

    objects = OwnedManager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["environment", "platform", "token"], name="device_environment_token_uniq")
        ]
        indexes = [models.Index(fields=["recipient", "active"], name="device_recipient_active_idx")]

    def __str__(self) -> str:
        return f"{self.platform}:{self.token[:8]}…"


class Topic(models.Model):
    """A named audience that notifications and campaigns can be sent to."""

    environment = owner_field()

    key = models.SlugField(max_length=128)
    name = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OwnedManager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["environment", "key"], name="topic_environment_key_uniq")]

    def __str__(self) -> str:
        return self.key


class Subscription(models.Model):
    """A recipient's membership of a topic; fan-out pages these by (topic, id)."""

    topic = models.ForeignKey(Topic, on_delete=models.CASCADE, related_name="subscriptions", db_index=False)
    recipient = models.ForeignKey(Recipient, on_delete=models.CASCADE, related_name="subscriptions")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OwnedManager("topic__environment_id")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["topic", "recipient"], name="subscription_uniq")]
        # Serves the fan-out's keyset page: WHERE topic_id = %s AND id > %s ORDER BY id LIMIT n.
        indexes = [models.Index(fields=["topic", "id"], name="subscription_keyset_idx")]

    def __str__(self) -> str:
        return f"{self.topic_id}:{self.recipient_id}"


class Suppression(models.Model):
    """An address that must not be sent to on a channel (bounce, complaint, STOP, unsubscribe, manual)."""

    class Source(models.TextChoices):
        BOUNCE = "bounce"
        COMPLAINT = "complaint"
        STOP = "stop"
        UNSUBSCRIBE = "unsubscribe"
        INVALID = "invalid"
        MANUAL = "manual"

    # Null: installation-wide, visible to every project and changed by none of them (what provider bounces and
    # complaints create: they protect a sending account all projects may share).
    environment = owner_field(null=True, blank=True)
    channel = models.CharField(max_length=16)
    address = models.CharField(max_length=4096)
    reason = models.CharField(max_length=255, blank=True, default="")
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.MANUAL)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OwnedManager(shared_null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["environment", "channel", "address"], name="suppression_uniq", nulls_distinct=False
            )
        ]

    def __str__(self) -> str:
        return f"{self.channel}:{self.source}"


class RecipientImport(models.Model):
    """An import of recipients from a CSV or JSON Lines file: its options, how far it got, and the rows refused.

    The admin's imports keep the uploaded file in `content` (a Celery task reads it); `manage.py
    import_recipients` reads its file and keeps here only the checkpoint, found again by `fingerprint` (the
    file's hash with the options) when it is run again after an interruption. `committed_line` is the last line
    whose chunk was committed, written in the same transaction as the chunk's recipients: a resumed import
    starts after it, so no row is written twice and none is skipped.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    class Format(models.TextChoices):
        CSV = "csv", "CSV"
        JSONL = "jsonl", "JSON Lines"

    environment = owner_field()
    name = models.CharField(max_length=255, help_text="The file's name.")
    file_format = models.CharField(max_length=8, choices=Format.choices, default=Format.CSV)
    # Hex SHA-256 of the file and the options; the command finds an unfinished import of the same file by it.
    fingerprint = models.CharField(max_length=64, blank=True, default="")
    content = models.TextField(blank=True, default="")
    # File column -> recipient field ("E-Mail" -> "email"); columns not named here are ignored.
    mapping = models.JSONField(default=dict, blank=True)
    topic_key = models.CharField(max_length=128, blank=True, default="", help_text="A topic every row joins.")
    dry_run = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    total_lines = models.PositiveIntegerField(default=0)
    committed_line = models.PositiveIntegerField(default=0)
    created = models.PositiveIntegerField(default=0)
    updated = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    # The first refused rows, [{"line", "field", "reason"}] (no values: they may be personal data).
    refusals = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True, default="")
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = OwnedManager()

    class Meta:
        indexes = [models.Index(fields=["environment", "fingerprint"], name="recipient_import_fp_idx")]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_status_display()})"
