"""The in-app channel's provider: the inbox is our own database, so "sending" is storing the message."""

from __future__ import annotations

from collections.abc import Sequence

from channels_app.providers.base import OutboundMessage, Outcome, Provider, SendResult


class InAppProvider(Provider):
    """Store in-app messages; the pipeline writes the rendered content onto the delivery row itself."""

    name = "inapp"
    channels = ("inapp",)

    def send(self, message: OutboundMessage) -> SendResult:
        return SendResult(provider_message_id=f"inapp-{message.delivery_id}")

    def send_batch(self, messages: Sequence[OutboundMessage]) -> list[Outcome]:
        return [self.send(m) for m in messages]
