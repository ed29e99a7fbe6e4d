"""Python client for Notifier: `Notifier` (sync) and `AsyncNotifier` (asyncio), typed results and errors."""

from __future__ import annotations

from notifier_client import webhooks
from notifier_client._async import AsyncNotifier
from notifier_client._core import Call, Page, RetryPolicy, __version__
from notifier_client._sync import Notifier
from notifier_client.errors import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    NotifierConnectionError,
    NotifierError,
    PermissionDeniedError,
    RateLimitedError,
    ServerError,
    WebhookVerificationError,
)
from notifier_client.models import (
    CancelResult,
    Delivery,
    DeliveryEvent,
    InboxToken,
    Notification,
    PreferenceLink,
    Preferences,
    Recipient,
    SubscribeResult,
    Suppression,
    Topic,
)

__all__ = [
    "AsyncNotifier",
    "AuthenticationError",
    "BadRequestError",
    "Call",
    "CancelResult",
    "ConflictError",
    "Delivery",
    "DeliveryEvent",
    "InboxToken",
    "NotFoundError",
    "Notification",
    "Notifier",
    "NotifierConnectionError",
    "NotifierError",
    "Page",
    "PermissionDeniedError",
    "PreferenceLink",
    "Preferences",
    "RateLimitedError",
    "Recipient",
    "RetryPolicy",
    "ServerError",
    "SubscribeResult",
    "Suppression",
    "Topic",
    "WebhookVerificationError",
    "__version__",
    "webhooks",
]
