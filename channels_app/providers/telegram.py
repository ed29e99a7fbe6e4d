"""Telegram provider: the Bot API's `sendMessage` to a chat id, with the bot token from the environment.

The installation's bot is TELEGRAM_BOT_TOKEN; a named account of PROVIDER_ACCOUNTS is a project's own bot
(`bot_token`), an adapter of its own with its own URL.

POST <TELEGRAM_BASE_URL>/bot<token>/sendMessage {"chat_id", "text"}; Telegram answers {"ok": true, "result":
{"message_id", …}} or {"ok": false, "error_code", "description", "parameters": {"retry_after"}}
(https://core.telegram.org/bots/api#making-requests). The token is part of the URL, so neither the URL nor a
transport exception's text (which may quote it) ever reaches an error message or a log.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import requests
from requests.adapters import HTTPAdapter

from channels_app.providers.base import (
    BotProvider,
    OutboundMessage,
    PermanentError,
    RetriableError,
    SendResult,
    parse_retry_after,
)
from channels_app.providers.deadline import CallDeadline, DeadlinePools, request_failure

# Telegram's text limit per message; a longer one is refused for the whole message.
TEXT_MAX = 4096
# The descriptions that say this chat can never receive the bot's messages: the address is suppressed.
SUPPRESS_DESCRIPTIONS = (
    "chat not found",
    "bot was blocked by the user",
    "user is deactivated",
    "bot was kicked",
    "bot is not a member",
    "have no rights to send a message",
)
MAX_ANSWER_BYTES = 65536


class _DeadlineAdapter(DeadlinePools, HTTPAdapter):
    """A pooled adapter (no retries) whose connections a CallDeadline can abort."""


class TelegramProvider(BotProvider):
    """Send Telegram messages as a bot."""

    name: ClassVar[str] = "telegram"
    channels: ClassVar[tuple[str, ...]] = ("telegram",)
    settings_prefix: ClassVar[str] = "TELEGRAM"

    def __init__(self, *, token: str, base_url: str, timeout: float = 10.0, pool_size: int = 16) -> None:
        self._url = f"{base_url.rstrip('/')}/bot{token}/sendMessage"
        self.timeout = timeout
        self.max_concurrency = pool_size
        self.session = requests.Session()
        self.session.trust_env = False  # no proxy from the environment
        adapter = _DeadlineAdapter(pool_connections=pool_size, pool_maxsize=pool_size, max_retries=0)
        self.session.mount("https://", adapter)
        self.session.mount("http://", adapter)

    @staticmethod
    def build_request(message: OutboundMessage) -> dict[str, Any]:
        """Return the sendMessage body: the chat part's text, plain (no parse mode: payload text stays text)."""
        return {"chat_id": message.address, "text": str(message.content.get("text") or "")[:TEXT_MAX]}

    def send(self, message: OutboundMessage) -> SendResult:
        """Send the message; return "<chat id>/<message id>"."""
        with CallDeadline(self.call_deadline) as call:
            try:
                response = self.session.post(
                    self._url, json=self.build_request(message), timeout=self.timeout, allow_redirects=False
                )
                answer = response.content[:MAX_ANSWER_BYTES]
            except requests.exceptions.RequestException as exc:
                # Never the exception's own text: it may quote the URL, which holds the token.
                failure = request_failure(exc, call) or RetriableError(
                    "request failed", code="request_error", maybe_sent=True
                )
                raise failure from None
        return self._outcome(response.status_code, response.headers.get("Retry-After"), answer, message)

    @staticmethod
    def _outcome(status: int, retry_header: str | None, answer: bytes, message: OutboundMessage) -> SendResult:
        try:
            data = json.loads(answer) if answer else {}
        except ValueError:
            data = {}
        data = data if isinstance(data, dict) else {}
        if 200 <= status < 300 and data.get("ok"):
            result = data.get("result") or {}
            return SendResult(provider_message_id=f"{message.address}/{result.get('message_id', '')}")
        code = f"http_{status}"
        description = str(data.get("description") or "").lower()
        found = data.get("parameters")
        parameters: dict[str, Any] = found if isinstance(found, dict) else {}
        if status == 429:
            retry_after = parameters.get("retry_after")
            wait = float(retry_after) if isinstance(retry_after, int | float) else parse_retry_after(retry_header)
            raise RetriableError("rate limited", code=code, retry_after=wait, throttled=True)
        if status >= 500 or status == 408:
            raise RetriableError("telegram error", code=code)
        if status in (401, 404) and not description.startswith("bad request"):
            # 401 Unauthorized / 404 Not Found on the method itself: the bot token is wrong (an operator's fix).
            raise RetriableError("telegram rejected the bot token", code=code)
        if any(reason in description for reason in SUPPRESS_DESCRIPTIONS):
            raise PermanentError("chat cannot receive the bot's messages", code=code, suppress=True)
        raise PermanentError("rejected by telegram", code=code)
