"""Slack provider: `chat.postMessage` through the official `slack_sdk` WebClient.

One bot token per installation (SLACK_BOT_TOKEN), and one per named account of PROVIDER_ACCOUNTS (a project's own
workspace bot, `bot_token`). The address is a user id (a direct message from the bot), a
conversation id or a channel name; the message is the chat part's `text` (Slack's notification and fallback
text) with its Block Kit `blocks` as given. The SDK's own retries are off: the pipeline owns retries, the shared
rate limit and the breaker. SLACK_BASE_URL points the real SDK at a stand-in.

Slack answers errors as HTTP 200 with `{"ok": false, "error": "<code>"}`, rate limits as HTTP 429 with
Retry-After and error `ratelimited`; both are sorted here (https://api.slack.com/methods/chat.postMessage).
"""

from __future__ import annotations

import logging
from http.client import HTTPException
from typing import Any, ClassVar
from urllib.error import URLError

from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web import WebClient

from channels_app.providers.base import (
    BotProvider,
    OutboundMessage,
    PermanentError,
    RetriableError,
    SendResult,
    parse_retry_after,
)

# The address is gone for good: the pipeline puts it on the suppression list.
SUPPRESS_ERRORS = frozenset({"is_archived", "user_not_found", "user_disabled", "channel_not_found"})
# This message can never be posted as it is (or to this conversation by this bot).
PERMANENT_ERRORS = frozenset(
    {
        "msg_too_long",
        "no_text",
        "invalid_blocks",
        "invalid_blocks_format",
        "too_many_attachments",
        "not_in_channel",
        "cannot_dm_bot",
        "restricted_action",
        "restricted_action_read_only_channel",
        "restricted_action_thread_only_channel",
        "restricted_action_non_threadable_channel",
        "duplicate_channel_not_found",
        "messages_tab_disabled",
        "invalid_arguments",
        "invalid_arg_name",
        "invalid_charset",
        "invalid_json",
        "json_not_object",
        "as_user_not_supported",
        "team_access_not_granted",
    }
)
THROTTLE_ERRORS = frozenset({"ratelimited", "rate_limited", "message_limit_exceeded"})
# The SDK logs request bodies (addresses, message text) at DEBUG: keep them out of our logs.
_quiet_logger = logging.getLogger("notifier.providers.slack.http")
_quiet_logger.setLevel(logging.WARNING)


class SlackProvider(BotProvider):
    """Post chat messages to Slack with a bot token."""

    name: ClassVar[str] = "slack"
    channels: ClassVar[tuple[str, ...]] = ("slack",)
    settings_prefix: ClassVar[str] = "SLACK"

    def __init__(self, *, token: str, base_url: str = "", timeout: float = 10.0, pool_size: int = 16) -> None:
        kwargs: dict[str, Any] = {"base_url": base_url} if base_url else {}
        # retry_handlers=[]: no SDK retries (its default retries a connection error once, out of our sight).
        self.client = WebClient(
            token=token, timeout=max(1, round(timeout)), logger=_quiet_logger, retry_handlers=[], **kwargs
        )
        self.max_concurrency = pool_size

    @staticmethod
    def build_request(message: OutboundMessage) -> dict[str, Any]:
        """Return the chat.postMessage arguments for `message` (its chat part's text and Block Kit blocks)."""
        content = message.content
        params: dict[str, Any] = {"channel": message.address, "text": str(content.get("text") or "")}
        blocks = content.get("blocks")
        if blocks:
            params["blocks"] = blocks
        return params

    def send(self, message: OutboundMessage) -> SendResult:
        """Post the message; return "<conversation id>/<ts>", Slack's id of the posted message."""
        try:
            response = self.client.chat_postMessage(**self.build_request(message))
        except SlackApiError as exc:
            raise self._classify(exc) from None
        except TimeoutError:
            # Slack may have posted it; the same provider only (Slack has no idempotency key for messages).
            raise RetriableError("timeout", code="timeout", maybe_sent=True) from None
        except URLError as exc:
            # urllib wraps what happened before a byte was sent (refused, unresolvable) in URLError.
            if isinstance(exc.reason, TimeoutError):
                raise RetriableError("timeout", code="timeout", maybe_sent=True) from None
            raise RetriableError("connection failed", code="connection_error") from None
        except (HTTPException, OSError):
            raise RetriableError(
                "connection lost after the request was sent", code="connection_error", maybe_sent=True
            ) from None
        except (SlackClientError, ValueError):
            # An answer the SDK could not read (not JSON): the request may have been handled.
            raise RetriableError("unreadable answer", code="client_error", maybe_sent=True) from None
        return SendResult(provider_message_id=f"{response.get('channel', '')}/{response.get('ts', '')}")

    @staticmethod
    def _classify(exc: SlackApiError) -> Exception:
        response = exc.response
        status = int(getattr(response, "status_code", 0) or 0)
        data = response.data if isinstance(getattr(response, "data", None), dict) else {}
        error = str(data.get("error") or f"http_{status}")[:64]
        headers = getattr(response, "headers", None) or {}
        retry_after = parse_retry_after(headers.get("Retry-After") or headers.get("retry-after"))
        # Slack's error codes name no person; the address is never part of the text.
        text = f"slack error {error} (HTTP {status})"
        if status == 429 or error in THROTTLE_ERRORS:
            return RetriableError(text, code=error, retry_after=retry_after, throttled=True)
        if status >= 500 or error in ("internal_error", "fatal_error", "service_unavailable", "request_timeout"):
            return RetriableError(text, code=error, retry_after=retry_after)
        if error in SUPPRESS_ERRORS:
            return PermanentError(text, code=error, suppress=True)
        if error in PERMANENT_ERRORS:
            return PermanentError(text, code=error)
        if error in ("invalid_auth", "not_authed", "token_revoked", "token_expired", "account_inactive") or (
            error in ("missing_scope", "not_allowed_token_type", "ekm_access_denied")
        ):
            # The bot's token or scopes (the installation's or an account's): not this message's fault, and fixable
            # by an operator.
            return RetriableError(text, code=error)
        return PermanentError(text, code=error)
