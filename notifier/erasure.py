"""Forget an erased recipient in what notifier keeps: delivery addresses and stored content.

Connected to preferences.signals.recipient_erased by NotifierConfig.ready(); the rows stay (other records and
the history point at them), their personal data goes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from notifier.models import Delivery
from preferences.models import Recipient


def deliveries_forget_recipient(*, recipient: Recipient, at: datetime, **_signal: Any) -> None:
    """Blank the address and content of every delivery made to `recipient`."""
    Delivery.objects.filter(recipient=recipient).update(address="", content=None, updated_at=at)
