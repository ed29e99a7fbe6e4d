"""What the sandbox providers "sent"."""

from __future__ import annotations

from django.db import models


class SandboxMessage(models.Model):
    """One message a sandbox provider recorded instead of sending; unique per delivery (idempotent)."""

    delivery_id = models.BigIntegerField(unique=True)
    # The API client whose notification made the message: GET /sandbox/messages lists a client's own only
    # (the messages carry OTPs and signed preference links). A plain id like the delivery's: channels_app
    # writes it at the send rate and never joins on it. Null: recorded before clients were kept here.
    client_id = models.BigIntegerField(null=True, blank=True)
    channel = models.CharField(max_length=16)
    provider = models.CharField(max_length=32, default="sandbox")
    address = models.CharField(max_length=4096)
    content = models.JSONField()
    # How many times the provider was asked to send this delivery. The recipient sees one message (the
    # sandbox deduplicates on the delivery, like a provider honouring an idempotency key); a count above one
    # shows a re-send reached the provider, which the fault tests check happens only after a lease expiry.
    send_count = models.PositiveIntegerField(default=1)
    # Not indexed: the table is written at the send rate and everything lists it by id.
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["channel", "address"], name="sandbox_channel_address_idx"),
            # Serves a client's keyset page (client_id = %s AND id < cursor ORDER BY id DESC).
            models.Index(fields=["client_id", "id"], name="sandbox_client_id_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} #{self.delivery_id}"
