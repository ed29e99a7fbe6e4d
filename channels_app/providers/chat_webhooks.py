"""Microsoft Teams and Discord providers: POST to the recipient's incoming-webhook URL.

The URL is the address, chosen by an API caller, so both go out through the webhook channel's guarded, bounded
HTTP path (WebhookProvider.post_bounded: SSRF guard with the checked address pinned, no redirects, the call
deadline, a bounded answer) and share its answer classes (2xx sent, 429 throttled with Retry-After, 5xx and 408
retried, 410 gone). A 404 means the webhook was deleted: the address is suppressed.

Teams gets an Adaptive Card (the chat part's own `card`, or one built from its `text`); Discord an embed (the
part's own `embed`, or one built from its `text`). Neither is signed: the URL itself is the credential.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from channels_app.providers.base import OutboundMessage, PermanentError, SendResult
from channels_app.providers.webhook import WebhookProvider

# Discord's limits (https://discord.com/developers/docs/resources/message): longer is a 400 for the whole message.
DISCORD_CONTENT_MAX = 2000
DISCORD_DESCRIPTION_MAX = 4096


def adaptive_card(content: Mapping[str, Any]) -> dict[str, Any]:
    """Return the Teams message for a chat part: its `card`, or an Adaptive Card with its `text`."""
    card = content.get("card") or {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": [{"type": "TextBlock", "text": str(content.get("text") or ""), "wrap": True}],
    }
    return {
        "type": "message",
        "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}
        ],
    }


def discord_message(content: Mapping[str, Any]) -> dict[str, Any]:
    """Return the Discord webhook body for a chat part: its `embed` (with `text` as content), or an embed of it.

    Mentions are never parsed: a payload value cannot ping @everyone or a role.
    """
    text = str(content.get("text") or "")
    body: dict[str, Any] = {"allowed_mentions": {"parse": []}}
    embed = content.get("embed")
    if embed:
        body["embeds"] = [embed]
        if text:
            body["content"] = text[:DISCORD_CONTENT_MAX]
    else:
        body["embeds"] = [{"description": text[:DISCORD_DESCRIPTION_MAX]}]
    return body


class _ChatWebhookProvider(WebhookProvider):
    """An incoming-webhook chat network: the body is built from the chat part, the answer sorted as a webhook's."""

    def build_body(self, message: OutboundMessage) -> dict[str, Any]:
        """Return the JSON body the network expects for `message`."""
        raise NotImplementedError

    def target(self, url: str) -> str:
        """Return the URL to POST to (the address as given, unless the network wants a parameter)."""
        return url

    def message_id(self, answer: bytes, message: OutboundMessage) -> str:
        """Return the network's id of the posted message, or our idempotency key when it gives none."""
        return message.idempotency_key

    def build_request(self, message: OutboundMessage, *, timestamp: int | None = None) -> tuple[bytes, dict[str, str]]:
        """Return the body and headers of the request (unsigned: the URL is the credential)."""
        body = json.dumps(self.build_body(message), separators=(",", ":"), ensure_ascii=False).encode()
        return body, {"Content-Type": "application/json"}

    def send(self, message: OutboundMessage) -> SendResult:
        """POST the message to the webhook URL; sort the answer as a webhook's (404: the webhook is gone)."""
        url = message.address
        if not url.lower().startswith(("http://", "https://")):
            raise PermanentError(f"{self.name} webhook URL must be http(s)", code="bad_url")
        body, headers = self.build_request(message)
        response, answer = self.post_bounded(self.target(url), body, headers)
        if response.status_code == 404:
            raise PermanentError("webhook not found", code="http_404", suppress=True)
        self._outcome(response.status_code, response.headers, message)
        return SendResult(provider_message_id=self.message_id(answer, message))


class TeamsProvider(_ChatWebhookProvider):
    """Post Adaptive Cards to Microsoft Teams incoming webhooks (Workflows or Office 365 connectors)."""

    name: ClassVar[str] = "teams"
    channels: ClassVar[tuple[str, ...]] = ("teams",)

    def build_body(self, message: OutboundMessage) -> dict[str, Any]:
        """Return the message with one Adaptive Card attachment."""
        return adaptive_card(message.content)


class DiscordProvider(_ChatWebhookProvider):
    """Post embeds to Discord webhooks; `?wait=true` has Discord answer with the message and its id."""

    name: ClassVar[str] = "discord"
    channels: ClassVar[tuple[str, ...]] = ("discord",)

    def build_body(self, message: OutboundMessage) -> dict[str, Any]:
        """Return the webhook body with one embed."""
        return discord_message(message.content)

    def target(self, url: str) -> str:
        """Ask Discord to answer with the created message (its id becomes the provider message id)."""
        return url + ("&" if "?" in url else "?") + "wait=true"

    def message_id(self, answer: bytes, message: OutboundMessage) -> str:
        """Return the created message's id from Discord's answer."""
        try:
            found = json.loads(answer)
        except ValueError:
            return message.idempotency_key
        return str(found.get("id") or message.idempotency_key) if isinstance(found, dict) else message.idempotency_key
