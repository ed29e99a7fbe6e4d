"""Forget an erased recipient in what channels_app keeps: the sandbox's record of what was sent to them.

Connected to preferences.signals.recipient_erased by ChannelsAppConfig.ready().
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from channels_app.models import SandboxMessage
from notifier.deliveries.models import Delivery
from preferences.models import Recipient


def sandbox_forget_recipient(*, recipient: Recipient, at: datetime, **_signal: Any) -> None:
    """Blank the address and content of the sandbox messages of every delivery made to `recipient`."""
    deliveries = Delivery.objects.filter(recipient=recipient).values("pk")
    SandboxMessage.objects.filter(delivery_id__in=deliveries).update(address="", content={})
