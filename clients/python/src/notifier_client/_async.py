"""The asynchronous client: the same calls as Notifier, awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
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


class AsyncNotifier:
    """An asyncio client of one Notifier server, with one API key; reuses connections. Close it when done.

    >>> async with AsyncNotifier(base_url="http://127.0.0.1:8000", api_key="...") as notifier:
    ...     n = await notifier.send(recipient="u-42", template="order_shipped", payload={"order_id": "A-1"})
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        timeout: float | httpx.Timeout = _core.DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        options = _core.client_options(base_url=base_url, api_key=api_key, timeout=timeout, headers=headers)
        self._http = httpx.AsyncClient(transport=transport, **options)
        self.retry = retry or RetryPolicy()

    async def __aenter__(self) -> AsyncNotifier:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def call(self, call: Call[T]) -> T:
        """Send a call, retrying 429, 5xx and connection errors per the retry policy; raise NotifierError."""
        started = time.monotonic()
        attempt = 0
        while True:
            failure: NotifierError
            try:
                response = await self._http.request(call.method, call.path, json=call.json, params=call.params)
            except httpx.TransportError as exc:
                failure = _core.failure_from_transport(exc)
            else:
                if response.status_code < 400:
                    return _core.result(call, response)
                failure = _core.failure_from_response(response)
            wait = self.retry.delay(attempt=attempt, elapsed=time.monotonic() - started, failure=failure)
            if wait is None:
                raise failure
            await asyncio.sleep(wait)
            attempt += 1

    async def _iterate(self, build: Any, **filters: Any) -> AsyncIterator[Any]:
        cursor: str | None = None
        while True:
            page: Page[Any] = await self.call(build(cursor=cursor, **filters))
            for item in page.items:
                yield item
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    # --- Notifications ---------------------------------------------------------------------------------------

    async def send(
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
        return await self.call(
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

    async def send_topic(
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
        return await self.call(
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

    async def send_batch(self, items: Sequence[Mapping[str, Any]]) -> list[Notification | NotifierError]:
        """Send up to 1,000 notifications (each a dict of send()'s arguments); one result or error per item."""
        return await self.call(_core.send_batch(items))

    async def get(self, notification_id: str) -> Notification:
        """Return a notification with its deliveries, their status and history."""
        return await self.call(_core.get(notification_id))

    async def cancel(self, notification_id: str) -> CancelResult:
        """Cancel the deliveries of a notification that are not sent yet."""
        return await self.call(_core.cancel(notification_id))

    def notifications(
        self, *, user_id: str | None = None, status: str | None = None, category: str | None = None
    ) -> AsyncIterator[Notification]:
        """Iterate over this client's notifications, newest first, following the cursor page by page."""
        return self._iterate(_core.list_notifications, user_id=user_id, status=status, category=category)

    # --- Recipients and preferences --------------------------------------------------------------------------

    async def put_recipient(self, user_id: str, **fields: Any) -> Recipient:
        """Create or update a recipient (email, phone, locale, timezone, webhook_url); fields left out are kept."""
        return await self.call(_core.put_recipient(user_id, **fields))

    async def get_recipient(self, user_id: str) -> Recipient:
        """Return a recipient."""
        return await self.call(_core.get_recipient(user_id))

    async def delete_recipient(self, user_id: str) -> None:
        """Erase a recipient's personal data."""
        return await self.call(_core.delete_recipient(user_id))

    async def add_device(self, user_id: str, *, token: str, platform: str = "fcm") -> dict[str, Any]:
        """Register a push token."""
        return await self.call(_core.add_device(user_id, token=token, platform=platform))

    async def remove_device(self, user_id: str, token: str) -> None:
        """Remove a push token."""
        return await self.call(_core.remove_device(user_id, token))

    async def get_preferences(self, user_id: str) -> Preferences:
        """Return a recipient's preferences."""
        return await self.call(_core.get_preferences(user_id))

    async def set_preferences(self, user_id: str, preferences: Preferences | Mapping[str, Any]) -> Preferences:
        """Replace a recipient's preferences."""
        return await self.call(_core.set_preferences(user_id, preferences))

    async def create_inbox_token(self, user_id: str, *, ttl_seconds: int | None = None) -> InboxToken:
        """Mint a short-lived token for one user's inbox, for a front end."""
        return await self.call(_core.create_inbox_token(user_id, ttl_seconds=ttl_seconds))

    async def create_preference_link(self, user_id: str, *, ttl_seconds: int | None = None) -> PreferenceLink:
        """Mint a signed, expiring link to the recipient's preference center."""
        return await self.call(_core.create_preference_link(user_id, ttl_seconds=ttl_seconds))

    # --- Topics and suppressions -----------------------------------------------------------------------------

    async def put_topic(self, key: str, *, name: str = "") -> Topic:
        """Create or rename a topic."""
        return await self.call(_core.put_topic(key, name=name))

    async def get_topic(self, key: str) -> Topic:
        """Return a topic with its subscriber count."""
        return await self.call(_core.get_topic(key))

    async def subscribe(self, key: str, user_ids: Sequence[str]) -> SubscribeResult:
        """Subscribe user ids to a topic (up to 10,000 per call)."""
        return await self.call(_core.subscribe(key, user_ids))

    async def unsubscribe(self, key: str, user_id: str) -> None:
        """Remove a user id from a topic."""
        return await self.call(_core.unsubscribe(key, user_id))

    def suppressions(self, *, channel: str | None = None, address: str | None = None) -> AsyncIterator[Suppression]:
        """Iterate over the suppression list, following the cursor."""
        return self._iterate(_core.list_suppressions, channel=channel, address=address)

    async def add_suppression(self, *, channel: str, address: str, reason: str = "") -> Suppression:
        """Stop sending to an address on a channel."""
        return await self.call(_core.add_suppression(channel=channel, address=address, reason=reason))

    async def remove_suppression(self, suppression_id: int) -> None:
        """Take an address off the suppression list."""
        return await self.call(_core.remove_suppression(suppression_id))
