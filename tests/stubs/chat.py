"""Stand-ins for the chat networks: Slack's Web API, the Telegram Bot API, Teams and Discord incoming webhooks.

Each checks what the real client put on the wire as the network would (the token, the method, the body's
required fields) and answers with the network's own success shape; tests queue errors with `respond`/`add_rule`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.stubs.http import RecordedRequest, StubHTTPServer, StubResponse

SLACK_TOKEN = "xoxb-stub-bot-token"
TELEGRAM_TOKEN = "123456:stub-telegram-token"


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> StubResponse:
    return StubResponse(status, json.dumps(body).encode(), headers or {})


class SlackStub(StubHTTPServer):
    """Slack's Web API `chat.postMessage`: Bearer token, JSON body with a channel and text or blocks.

    `tokens` are the bot tokens it knows (the installation's; a test adds a project's own workspace bot).
    """

    def __init__(self) -> None:
        super().__init__()
        self.tokens = {SLACK_TOKEN}

    def default_response(self, request: RecordedRequest) -> StubResponse:
        """Post the message, or answer as Slack does when the token or the arguments are wrong."""
        if request.route != "/api/chat.postMessage":
            return _json(404, {"ok": False, "error": "unknown_method"})
        if request.header("Authorization") not in {f"Bearer {token}" for token in self.tokens}:
            return _json(200, {"ok": False, "error": "invalid_auth"})
        try:
            body = request.json()
        except ValueError:
            return _json(200, {"ok": False, "error": "invalid_json"})
        if not body.get("channel"):
            return _json(200, {"ok": False, "error": "channel_not_found"})
        if not body.get("text") and not body.get("blocks"):
            return _json(200, {"ok": False, "error": "no_text"})
        if "blocks" in body and not isinstance(body["blocks"], list):
            return _json(200, {"ok": False, "error": "invalid_blocks_format"})
        channel = body["channel"] if not body["channel"].startswith("#") else "C0STUBCHAN"
        ts = f"{time.time():.6f}"
        return _json(200, {"ok": True, "channel": channel, "ts": ts, "message": {"text": body.get("text"), "ts": ts}})

    def posts(self) -> list[dict[str, Any]]:
        """Return the JSON bodies of the chat.postMessage calls received."""
        return [r.json() for r in self.requests if r.route == "/api/chat.postMessage"]

    def tokens_by_channel(self) -> dict[str, str]:
        """Return the bearer token each chat.postMessage was made with, by the conversation it posted to."""
        return {
            r.json()["channel"]: r.header("Authorization").removeprefix("Bearer ")
            for r in self.requests
            if r.route == "/api/chat.postMessage"
        }

    def error(
        self, error: str, *, status: int = 200, headers: dict[str, str] | None = None, times: int | None = None
    ) -> None:
        """Answer the next posts (`times`, or all) with Slack error `error`."""
        self.respond(status, {"ok": False, "error": error}, headers=headers, times=times)


class TelegramStub(StubHTTPServer):
    """The Bot API's sendMessage: the token in the path, a JSON body with chat_id and text.

    `tokens` are the bots it knows (the installation's; a test adds a project's own bot).
    """

    def __init__(self) -> None:
        super().__init__()
        self.tokens = {TELEGRAM_TOKEN}

    def default_response(self, request: RecordedRequest) -> StubResponse:
        """Send the message, or answer as the Bot API does for a wrong token or a bad body."""
        if request.route not in {f"/bot{token}/sendMessage" for token in self.tokens}:
            return _json(
                404,
                {"ok": False, "error_code": 404, "description": "Not Found"},
            )
        body = request.json()
        if not body.get("chat_id"):
            return _json(400, {"ok": False, "error_code": 400, "description": "Bad Request: chat_id is empty"})
        if not body.get("text"):
            return _json(400, {"ok": False, "error_code": 400, "description": "Bad Request: message text is empty"})
        result = {"message_id": len(self.requests), "chat": {"id": body["chat_id"]}, "text": body["text"]}
        return _json(200, {"ok": True, "result": result})

    def messages(self) -> list[dict[str, Any]]:
        """Return the sendMessage bodies received."""
        return [r.json() for r in self.requests if r.route.endswith("/sendMessage")]

    def tokens_by_chat(self) -> dict[str, str]:
        """Return the bot token in the path of each sendMessage received, by the chat it was sent to."""
        return {
            r.json()["chat_id"]: r.route.removeprefix("/bot").removesuffix("/sendMessage")
            for r in self.requests
            if r.route.endswith("/sendMessage")
        }


class ChatWebhookStub(StubHTTPServer):
    """Teams and Discord incoming webhooks on one server: /teams/<id> and /discord/<id>/<token>.

    Teams (Workflows) answers 202 to a message with an Adaptive Card attachment; Discord with `?wait=true`
    answers 200 with the message and its id, and 400 to a body with neither content nor embeds.
    """

    def default_response(self, request: RecordedRequest) -> StubResponse:
        """Accept a well-formed message of either network."""
        body = request.json()
        if request.route.startswith("/teams/"):
            attachments = body.get("attachments") or []
            ok = (
                body.get("type") == "message"
                and attachments
                and all(
                    a.get("contentType") == "application/vnd.microsoft.card.adaptive"
                    and a.get("content", {}).get("type") == "AdaptiveCard"
                    for a in attachments
                )
            )
            return StubResponse(202, b"") if ok else _json(400, {"error": "Bad payload"})
        if request.route.startswith("/discord/"):
            if not body.get("content") and not body.get("embeds"):
                return _json(400, {"code": 50006, "message": "Cannot send an empty message"})
            return _json(
                200,
                {
                    "id": f"11{len(self.requests):016d}",
                    "content": body.get("content", ""),
                    "embeds": body.get("embeds", []),
                },
            )
        return _json(404, {"message": "Unknown Webhook", "code": 10015})

    def bodies(self, network: str) -> list[dict[str, Any]]:
        """Return the JSON bodies posted to `network`'s webhooks."""
        return [r.json() for r in self.requests if r.route.startswith(f"/{network}/")]
