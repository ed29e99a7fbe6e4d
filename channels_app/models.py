"""What the sandbox providers "sent"."""

from __future__ import annotations

from django.db import models

from projects.scoping import OwnedManager


class SandboxMessage(models.Model):
    """One message a sandbox provider recorded instead of sending; unique per delivery (idempotent)."""

    delivery_id = models.BigIntegerField(unique=True)
    # The API client whose notification made the message: GET /sandbox/messages lists a client's own only
    # (the messages carry OTPs and signed preference links). A plain id like the delivery's: channels_app
    # writes it at the send rate and never joins on it (no constraint, no index of its own: the keyset index
    # below leads with it). Null: recorded before clients were kept here. The message's owner is its client's.
    client = models.ForeignKey(
        "clients.ApiClient",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
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

    objects = OwnedManager("client__environment_id")

    class Meta:
        indexes = [
            models.Index(fields=["channel", "address"], name="sandbox_channel_address_idx"),
            # Serves a client's keyset page (client_id = %s AND id < cursor ORDER BY id DESC).
            models.Index(fields=["client", "id"], name="sandbox_client_id_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} #{self.delivery_id}"
