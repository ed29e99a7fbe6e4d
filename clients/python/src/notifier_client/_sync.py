"""The synchronous client."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from notifier_client import _core
from notifier_client._core import Call, Page, RetryPolicy
from notifier_client.errors import NotifierError
from notifier_client.models import (
    CancelResult,
    InboxToken,
    Notification,
    PreferenceLink,
    Preferences,
    Recipient,
    SubscribeResult,
    Suppression,
    Topic,
)

T = TypeVar("T")


class Notifier:
    """A client of one Notifier server, with one API key; thread-safe, reuses connections. Close it when done.

    >>> from notifier_client import Notifier
    >>> notifier = Notifier(base_url="http://127.0.0.1:8000", api_key="...")
    >>> n = notifier.send(recipient="u-42", template="order_shipped", payload={"order_id": "A-1"})
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        timeout: float | httpx.Timeout = _core.DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        options = _core.client_options(base_url=base_url, api_key=api_key, timeout=timeout, headers=headers)
        self._http = httpx.Client(transport=transport, **options)
        self.retry = retry or RetryPolicy()

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def call(self, call: Call[T]) -> T:
        """Send a call, retrying 429, 5xx and connection errors per the retry policy; raise NotifierError."""
        started = time.monotonic()
        attempt = 0
        while True:
            failure: NotifierError
            try:
                response = self._http.request(call.method, call.path, json=call.json, params=call.params)
            except httpx.TransportError as exc:
                failure = _core.failure_from_transport(exc)
            else:
                if response.status_code < 400:
                    return _core.result(call, response)
                failure = _core.failure_from_response(response)
            wait = self.retry.delay(attempt=attempt, elapsed=time.monotonic() - started, failure=failure)
            if wait is None:
                raise failure
            time.sleep(wait)
            attempt += 1

    def _iterate(self, build: Any, **filters: Any) -> Iterator[Any]:
        cursor: str | None = None
        while True:
            page: Page[Any] = self.call(build(cursor=cursor, **filters))
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    # --- Notifications ---------------------------------------------------------------------------------------

    def send(
        self,
        *,
        recipient: str | Mapping[str, Any],
        template: str,
        channels: Sequence[str] | None = None,
        payload: Mapping[str, Any] | None = None,
        dedup_key: str | None = None,
        category: str | None = None,
        **more: Any,
    ) -> Notification:
        """Send a notification to one recipient (a user id); without `dedup_key` one is generated for this call."""
        return self.call(
            _core.send(
                recipient=recipient,
                template=template,
                channels=channels,
                payload=payload,
                dedup_key=dedup_key,
                category=category,
                **more,
            )
        )

    def send_topic(
        self,
        *,
        topic: str,
        template: str,
        channels: Sequence[str] | None = None,
        payload: Mapping[str, Any] | None = None,
        dedup_key: str | None = None,
        category: str | None = None,
        **more: Any,
    ) -> Notification:
        """Send a notification to every subscriber of a topic."""
        return self.call(
            _core.send(
                topic=topic,
                template=template,
                channels=channels,
                payload=payload,
                dedup_key=dedup_key,
                category=category,
                **more,
            )
        )

    def send_batch(self, items: Sequence[Mapping[str, Any]]) -> list[Notification | NotifierError]:
        """Send up to 1,000 notifications (each a dict of send()'s arguments); one result or error per item."""
        return self.call(_core.send_batch(items))

    def get(self, notification_id: str) -> Notification:
        """Return a notification with its deliveries, their status and history."""
        return self.call(_core.get(notification_id))

    def cancel(self, notification_id: str) -> CancelResult:
        """Cancel the deliveries of a notification that are not sent yet."""
        return self.call(_core.cancel(notification_id))

    def notifications(
        self, *, user_id: str | None = None, status: str | None = None, category: str | None = None
    ) -> Iterator[Notification]:
        """Iterate over this client's notifications, newest first, following the cursor page by page."""
        return self._iterate(_core.list_notifications, user_id=user_id, status=status, category=category)

    # --- Recipients and preferences --------------------------------------------------------------------------

    def put_recipient(self, user_id: str, **fields: Any) -> Recipient:
        """Create or update a recipient (email, phone, locale, timezone, webhook_url); fields left out are kept."""
        return self.call(_core.put_recipient(user_id, **fields))

    def get_recipient(self, user_id: str) -> Recipient:
        """Return a recipient."""
        return self.call(_core.get_recipient(user_id))

    def delete_recipient(self, user_id: str) -> None:
        """Erase a recipient's personal data."""
        return self.call(_core.delete_recipient(user_id))

    def add_device(self, user_id: str, *, token: str, platform: str = "fcm") -> dict[str, Any]:
        """Register a push token."""
        return self.call(_core.add_device(user_id, token=token, platform=platform))

    def remove_device(self, user_id: str, token: str) -> None:
        """Remove a push token."""
        return self.call(_core.remove_device(user_id, token))

    def get_preferences(self, user_id: str) -> Preferences:
        """Return a recipient's preferences."""
        return self.call(_core.get_preferences(user_id))

    def set_preferences(self, user_id: str, preferences: Preferences | Mapping[str, Any]) -> Preferences:
        """Replace a recipient's preferences."""
        return self.call(_core.set_preferences(user_id, preferences))

    def create_inbox_token(self, user_id: str, *, ttl_seconds: int | None = None) -> InboxToken:
        """Mint a short-lived token for one user's inbox, for a front end."""
        return self.call(_core.create_inbox_token(user_id, ttl_seconds=ttl_seconds))

    def create_preference_link(self, user_id: str, *, ttl_seconds: int | None = None) -> PreferenceLink:
        """Mint a signed, expiring link to the recipient's preference center."""
        return self.call(_core.create_preference_link(user_id, ttl_seconds=ttl_seconds))

    # --- Topics and suppressions -----------------------------------------------------------------------------

    def put_topic(self, key: str, *, name: str = "") -> Topic:
        """Create or rename a topic."""
        return self.call(_core.put_topic(key, name=name))

    def get_topic(self, key: str) -> Topic:
        """Return a topic with its subscriber count."""
        return self.call(_core.get_topic(key))

    def subscribe(self, key: str, user_ids: Sequence[str]) -> SubscribeResult:
        """Subscribe user ids to a topic (up to 10,000 per call)."""
        return self.call(_core.subscribe(key, user_ids))

    def unsubscribe(self, key: str, user_id: str) -> None:
        """Remove a user id from a topic."""
        return self.call(_core.unsubscribe(key, user_id))

    def suppressions(self, *, channel: str | None = None, address: str | None = None) -> Iterator[Suppression]:
        """Iterate over the suppression list, following the cursor."""
        return self._iterate(_core.list_suppressions, channel=channel, address=address)

    def add_suppression(self, *, channel: str, address: str, reason: str = "") -> Suppression:
        """Stop sending to an address on a channel."""
        return self.call(_core.add_suppression(channel=channel, address=address, reason=reason))

    def remove_suppression(self, suppression_id: int) -> None:
        """Take an address off the suppression list."""
        return self.call(_core.remove_suppression(suppression_id))
