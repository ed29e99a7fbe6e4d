"""API clients: the calling services, their hashed keys, scopes, categories and rate limits."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models

from core.scopes import default_scopes
from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID


class ApiClient(models.Model):
    """A calling service. Its API key is stored only as a SHA-256 hash."""

    class Mode(models.TextChoices):
        LIVE = "live"
        # Every delivery of a test client goes to the sandbox provider, whatever providers are configured.
        TEST = "test"

    # The project environment the key belongs to: the owner of everything the key makes. Its name is the key's
    # mode (ApiClient.mode, kept as a column because the hot path reads it with the client).
    environment = models.ForeignKey(
        "projects.Environment",
        on_delete=models.PROTECT,
        related_name="clients",
        default=DEFAULT_LIVE_ENVIRONMENT_ID,
        # Rows inserted by SQL (tests, scripts) land where the ORM's unscoped rows do, as every owner column.
        db_default=DEFAULT_LIVE_ENVIRONMENT_ID,
    )
    name = models.CharField(max_length=128, unique=True)
    key_prefix = models.CharField(max_length=16, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    # Empty means every configured category is allowed.
    allowed_categories = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    # What the key may do (core.scopes.SCOPES); a new client can only send.
    # The database default too, so rows inserted by SQL (tests, scripts) get `send` like the ORM's.
    scopes = ArrayField(models.CharField(max_length=32), default=default_scopes, db_default=["send"], blank=True)
    # Requests per period across all API processes ("200/s", "1000/m"); empty means API_CLIENT_RATE_LIMIT.
    rate_limit = models.CharField(max_length=32, blank=True, default="", db_default="")
    # Where webhook-channel deliveries go when the recipient has no URL of their own, and the secret
    # ("whsec_…", Standard Webhooks) they are signed with.
    webhook_url = models.URLField(max_length=2048, blank=True, default="")
    webhook_secret = models.CharField(max_length=128, blank=True, default="")
    is_active = models.BooleanField(default=True)
    # Chosen when the client is created and fixed afterwards: a notification's mode is its client's, so
    # changing it later would relabel what was already sent. db_default: rows inserted by SQL are live.
    mode = models.CharField(max_length=4, choices=Mode.choices, default=Mode.LIVE, db_default=Mode.LIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "notifier_apiclient"

    def __str__(self) -> str:
        return self.name

    # DRF's IsAuthenticated asks this of request.user; an API client is the authenticated principal.
    is_authenticated = True
