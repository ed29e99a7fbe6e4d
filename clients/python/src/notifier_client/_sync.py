"""The synchronous client."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from notifier_client import _core
from notifier_client._core import Call, Page, RetryPolicy
from notifier_client.errors import NotifierError
from notifier_client.models import (
    Campaign,
    CancelResult,
    DeadLetter,
    EventAttempt,
    EventEndpoint,
    InboxItem,
    InboxReadAll,
    InboxToken,
    InboxUser,
    Layout,
    Notification,
    PreferenceLink,
    Preferences,
    Preview,
    Project,
    PromotionCandidate,
    PromotionResult,
    Recipient,
    RecipientResult,
    SandboxMessage,
    Stats,
    SubscribeResult,
    Suppression,
    Template,
    TemplateVersion,
    Topic,
    Workflow,
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
                response = self._http.request(
                    call.method, call.url, json=call.json, params=call.params, headers=call.headers
                )
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

    def _iterate(self, build: Any, *args: Any, **filters: Any) -> Iterator[Any]:
        cursor: str | None = None
        while True:
            page: Page[Any] = self.call(build(*args, cursor=cursor, **filters))
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    # --- Notifications ---------------------------------------------------------------------------------------

    def send(
        self,
        *,
        recipient: str | Mapping[str, Any],
        template: str | None = None,
        workflow: str | None = None,
        channels: Sequence[str] | None = None,
        payload: Mapping[str, Any] | None = None,
        dedup_key: str | None = None,
        category: str | None = None,
        **more: Any,
    ) -> Notification:
        """Send a notification to one recipient (a user id); without `dedup_key` one is generated for this call.

        Give `template` for one message, or `workflow` ("key" or "key@3") to run a workflow's steps for them.
        """
        return self.call(
            _core.send(
                recipient=recipient,
                template=template,
                workflow=workflow,
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
        template: str | None = None,
        workflow: str | None = None,
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
                workflow=workflow,
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
        self,
        *,
        user_id: str | None = None,
        status: str | None = None,
        category: str | None = None,
        limit: int | None = None,
    ) -> Iterator[Notification]:
        """Iterate over this client's notifications, newest first, following the cursor page by page."""
        return self._iterate(_core.list_notifications, user_id=user_id, status=status, category=category, limit=limit)

    # --- Recipients and preferences --------------------------------------------------------------------------

    def put_recipient(self, user_id: str, **fields: Any) -> Recipient:
        """Create or update a recipient (email, phone, locale, timezone, webhook_url); fields left out are kept."""
        return self.call(_core.put_recipient(user_id, **fields))

    def put_recipients(self, recipients: Sequence[Mapping[str, Any]]) -> list[RecipientResult | NotifierError]:
        """Create or update up to 1,000 recipients, each alone: a result or the error of each, in order."""
        return self.call(_core.put_recipients(recipients))

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

    def suppressions(
        self, *, channel: str | None = None, address: str | None = None, limit: int | None = None
    ) -> Iterator[Suppression]:
        """Iterate over the suppression list, following the cursor."""
        return self._iterate(_core.list_suppressions, channel=channel, address=address, limit=limit)

    def add_suppression(self, *, channel: str, address: str, reason: str = "") -> Suppression:
        """Stop sending to an address on a channel."""
        return self.call(_core.add_suppression(channel=channel, address=address, reason=reason))

    def remove_suppression(self, suppression_id: int) -> None:
        """Take an address off the suppression list."""
        return self.call(_core.remove_suppression(suppression_id))

    # --- Lists of recipients and topics ----------------------------------------------------------------------

    def recipients(
        self, *, email: str | None = None, phone: str | None = None, limit: int | None = None
    ) -> Iterator[Recipient]:
        """Iterate over this installation's recipients (optionally those with one email or phone), page by page."""
        return self._iterate(_core.list_recipients, email=email, phone=phone, limit=limit)

    def topics(self, *, limit: int | None = None) -> Iterator[Topic]:
        """Iterate over the topics, page by page."""
        return self._iterate(_core.list_topics, limit=limit)

    # --- The in-app inbox --------------------------------------------------------------------------------------

    def inbox(self, user_id: str, *, unread: bool | None = None, limit: int | None = None) -> Iterator[InboxItem]:
        """Iterate over a recipient's inbox, newest first (only unread items with `unread=True`)."""
        return self._iterate(_core.list_inbox, user_id, unread=unread, limit=limit)

    def mark_inbox_read(self, user_id: str, delivery_id: int) -> InboxItem:
        """Mark one inbox item read (its delivery moves to `opened`)."""
        return self.call(_core.mark_inbox_read(user_id, delivery_id))

    def mark_inbox_all_read(self, user_id: str) -> InboxReadAll:
        """Mark a recipient's whole inbox read."""
        return self.call(_core.mark_inbox_all_read(user_id))

    def browser_inbox(self, token: str, *, unread: bool | None = None, limit: int | None = None) -> Iterator[InboxItem]:
        """Iterate over the inbox an inbox token opens, as a front end sees it (the API key is not sent)."""
        return self._iterate(_core.list_browser_inbox, token, unread=unread, limit=limit)

    def browser_mark_read(self, token: str, delivery_id: int) -> InboxItem:
        """Mark one item read with an inbox token."""
        return self.call(_core.browser_mark_read(token, delivery_id))

    def browser_mark_all_read(self, token: str) -> InboxReadAll:
        """Mark the whole inbox of an inbox token read."""
        return self.call(_core.browser_mark_all_read(token))

    def archive_inbox_item(self, user_id: str, delivery_id: int) -> InboxItem:
        """Archive one inbox item (it is read too, and leaves the default list)."""
        return self.call(_core.inbox_item_action(user_id, delivery_id, "archive"))

    def unarchive_inbox_item(self, user_id: str, delivery_id: int) -> InboxItem:
        """Bring an archived inbox item back to the default list."""
        return self.call(_core.inbox_item_action(user_id, delivery_id, "unarchive"))

    def click_inbox_item(self, user_id: str, delivery_id: int) -> InboxItem:
        """Count a click on an inbox item's action URL (a `clicked` event) and mark it read."""
        return self.call(_core.inbox_item_action(user_id, delivery_id, "click"))

    def browser_archive(self, token: str, delivery_id: int) -> InboxItem:
        """Archive one item with an inbox token."""
        return self.call(_core.browser_item_action(token, delivery_id, "archive"))

    def browser_unarchive(self, token: str, delivery_id: int) -> InboxItem:
        """Unarchive one item with an inbox token."""
        return self.call(_core.browser_item_action(token, delivery_id, "unarchive"))

    def browser_click(self, token: str, delivery_id: int) -> InboxItem:
        """Count a click on an item's action URL with an inbox token."""
        return self.call(_core.browser_item_action(token, delivery_id, "click"))

    def browser_me(self, token: str) -> InboxUser:
        """Return who an inbox token opens, their locale and a link to their preference center."""
        return self.call(_core.browser_me(token))

    # --- Templates and email layouts ---------------------------------------------------------------------------

    def templates(self, *, limit: int | None = None) -> Iterator[Template]:
        """Iterate over the templates, page by page."""
        return self._iterate(_core.list_templates, limit=limit)

    def put_template(
        self,
        key: str,
        *,
        category: str,
        content: Mapping[str, Any],
        default_locale: str | None = None,
        publish: bool = True,
        layout: str | None = None,
    ) -> TemplateVersion:
        """Create the next version of a template (published unless `publish` is false)."""
        return self.call(
            _core.put_template(
                key, category=category, content=content, default_locale=default_locale, publish=publish, layout=layout
            )
        )

    def get_template(self, key: str) -> Template:
        """Return a template with its published version."""
        return self.call(_core.get_template(key))

    def get_template_version(self, key: str, version: int) -> TemplateVersion:
        """Return one version of a template with its content (drafts included)."""
        return self.call(_core.get_template_version(key, version))

    def preview_template(
        self,
        key: str,
        *,
        payload: Mapping[str, Any] | None = None,
        locale: str | None = None,
        version: int | None = None,
    ) -> Preview:
        """Render every channel of a version (default: the published one) with a sample payload."""
        return self.call(_core.preview_template(key, payload=payload, locale=locale, version=version))

    def put_layout(self, key: str, *, html: str, text: str = "") -> Layout:
        """Create the next version of an email layout (`html`, and `text`, place the message with {{ content }})."""
        return self.call(_core.put_layout(key, html=html, text=text))

    def get_layout(self, key: str) -> Layout:
        """Return an email layout in its current version."""
        return self.call(_core.get_layout(key))

    def rollback_template(self, key: str, *, version: int) -> TemplateVersion:
        """Publish an earlier version of a template again, as its next version (answers that new version)."""
        return self.call(_core.rollback_template(key, version=version))

    def rollback_layout(self, key: str, *, version: int) -> Layout:
        """Use an earlier version of an email layout again, as its next version (answers key and new version)."""
        return self.call(_core.rollback_layout(key, version=version))

    # --- Workflows ---------------------------------------------------------------------------------------------

    def put_workflow(self, key: str, *, category: str, steps: Sequence[Mapping[str, Any]]) -> Workflow:
        """Create the next version of a workflow."""
        return self.call(_core.put_workflow(key, category=category, steps=steps))

    def get_workflow(self, key: str) -> Workflow:
        """Return a workflow."""
        return self.call(_core.get_workflow(key))

    def workflows(self, *, limit: int | None = None) -> Iterator[Workflow]:
        """Iterate over the workflows, page by page."""
        return self._iterate(_core.list_workflows, limit=limit)

    def rollback_workflow(self, key: str, *, version: int) -> Workflow:
        """Run an earlier version of a workflow again, as its next version (answers that new version)."""
        return self.call(_core.rollback_workflow(key, version=version))

    # --- The key's project -------------------------------------------------------------------------------------

    def get_project(self) -> Project:
        """Return the key's project and environment, with its daily quotas (limit, used, reset) and promotion rule."""
        return self.call(_core.get_project())

    # --- Promotion from test to live ---------------------------------------------------------------------------

    def promotions(self) -> list[PromotionCandidate]:
        """Return every layout, template and workflow whose test version differs from live's, with a diff."""
        return self.call(_core.promotions())

    def promote(self, items: Sequence[Mapping[str, Any]]) -> list[PromotionResult]:
        """Copy each item's (`{"kind": "template", "key": ...}`) test version to live; one result per item."""
        return self.call(_core.promote(items))

    # --- Campaigns ---------------------------------------------------------------------------------------------

    def campaigns(self, *, status: str | None = None, limit: int | None = None) -> Iterator[Campaign]:
        """Iterate over the campaigns, page by page."""
        return self._iterate(_core.list_campaigns, status=status, limit=limit)

    def create_campaign(self, *, name: str, template: str, topic: str, **fields: Any) -> Campaign:
        """Create a campaign: `fields` are the API's (category, channels, payload, send_at, crontab, draft...)."""
        return self.call(_core.create_campaign(name=name, template=template, topic=topic, **fields))

    def get_campaign(self, campaign_id: int) -> Campaign:
        """Return a campaign with its progress and runs (in `raw`)."""
        return self.call(_core.get_campaign(campaign_id))

    def update_campaign(self, campaign_id: int, **fields: Any) -> Campaign:
        """Change some fields of a campaign."""
        return self.call(_core.update_campaign(campaign_id, **fields))

    def campaign_action(self, campaign_id: int, action: str) -> Campaign:
        """Pause, resume or cancel a campaign (`action` is one of those words)."""
        return self.call(_core.campaign_action(campaign_id, action))

    # --- Operations: dead letters and the sandbox --------------------------------------------------------------

    def dead_letters(
        self, *, channel: str | None = None, status: str | None = None, limit: int | None = None
    ) -> Iterator[DeadLetter]:
        """Iterate over the dead letters, page by page."""
        return self._iterate(_core.list_dead_letters, channel=channel, status=status, limit=limit)

    def replay_dead_letter(self, dead_letter_id: int) -> DeadLetter:
        """Send a dead letter's delivery again."""
        return self.call(_core.replay_dead_letter(dead_letter_id))

    def discard_dead_letter(self, dead_letter_id: int) -> DeadLetter:
        """Give up on a dead letter for good."""
        return self.call(_core.discard_dead_letter(dead_letter_id))

    def replay_dead_letters(
        self, *, ids: Sequence[int] | None = None, all: bool = False, channel: str | None = None
    ) -> int:
        """Replay these dead letters, or all of them (of one channel); return how many were replayed."""
        return self.call(_core.replay_dead_letters(ids=ids, all=all, channel=channel))

    def sandbox_messages(
        self,
        *,
        channel: str | None = None,
        address: str | None = None,
        delivery_id: int | None = None,
        limit: int | None = None,
    ) -> Iterator[SandboxMessage]:
        """Iterate over what the sandbox provider recorded instead of sending, newest first."""
        return self._iterate(
            _core.list_sandbox_messages, channel=channel, address=address, delivery_id=delivery_id, limit=limit
        )

    # --- Status events: the endpoint ---------------------------------------------------------------------------

    def get_event_endpoint(self) -> EventEndpoint:
        """Return where this client's status events go."""
        return self.call(_core.get_event_endpoint())

    def set_event_endpoint(
        self, *, url: str, events: Sequence[str] | None = None, max_batch: int | None = None
    ) -> EventEndpoint:
        """Create or change the event endpoint; on creation the answer carries its signing `secret`."""
        return self.call(_core.set_event_endpoint(url=url, events=events, max_batch=max_batch))

    def delete_event_endpoint(self) -> None:
        """Stop sending status events."""
        return self.call(_core.delete_event_endpoint())

    def rotate_event_secret(self) -> EventEndpoint:
        """Replace the endpoint's signing secret; the answer carries the new one."""
        return self.call(_core.rotate_event_secret())

    def event_attempts(self, *, limit: int | None = None) -> Iterator[EventAttempt]:
        """Iterate over the recent tries to deliver status events, newest first."""
        return self._iterate(_core.list_event_attempts, limit=limit)

    # --- Statistics --------------------------------------------------------------------------------------------

    def stats(
        self,
        *,
        from_day: dt.date | str,
        to_day: dt.date | str,
        group_by: Sequence[str] = ("day",),
        mode: str | None = None,
        scope: str | None = None,
    ) -> Stats:
        """Return delivery counts per group (day, channel, status, template, client): this key's, or its project's.

        `scope="project"` counts every key's notifications of this key's project environment.
        """
        return self.call(_core.stats(from_day=from_day, to_day=to_day, group_by=group_by, mode=mode, scope=scope))
