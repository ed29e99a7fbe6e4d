"""The chat channels: their names, and the address rules each network's API accepts.

Kept in core because settings, the queue topology, templates and recipients all need the list, and the rules are
plain data checks (the URL rule leaves the address decision to the SSRF guard, core.ssrf).
"""

from __future__ import annotations

import re

# Every chat network is a channel of its own (its own queues, providers, rate limits, preferences); a template
# serves all of them with one `chat` part.
CHAT_CHANNELS: tuple[str, ...] = ("slack", "teams", "discord", "telegram", "whatsapp")
# The networks reached through an incoming-webhook URL (the address is the URL).
WEBHOOK_NETWORKS: frozenset[str] = frozenset({"teams", "discord"})
# The template content key that serves every chat channel.
CHAT_PART = "chat"

# Slack conversation ids (C channel, G private channel or group DM, D direct message) and user ids (U, W), or a
# channel name "#ops" (chat.postMessage takes either).
_SLACK_ID = re.compile(r"^[CGDUW][A-Z0-9]{6,20}$")
_SLACK_NAME = re.compile(r"^#[a-z0-9][a-z0-9._-]{0,79}$")
# Telegram chat ids are integers (negative for groups and channels), or "@name" for a public channel.
_TELEGRAM_ID = re.compile(r"^-?[0-9]{1,20}$")
_TELEGRAM_NAME = re.compile(r"^@[A-Za-z][A-Za-z0-9_]{4,31}$")


def is_chat(channel: str) -> bool:
    """Return whether `channel` is one of the chat networks."""
    return channel in CHAT_CHANNELS


def content_key(channel: str) -> str:
    """Return the template content key that serves `channel` (`chat` for every chat network)."""
    return CHAT_PART if channel in CHAT_CHANNELS else channel


def slack_address_error(value: str) -> str | None:
    """Return why `value` is not a Slack conversation or user id or a #channel name, or None."""
    if _SLACK_ID.match(value) or _SLACK_NAME.match(value):
        return None
    return "Must be a Slack user or conversation id (U024BE7LH, C024BE91L) or a channel name (#ops)."


def telegram_address_error(value: str) -> str | None:
    """Return why `value` is not a Telegram chat id or @channel name, or None."""
    if _TELEGRAM_ID.match(value) or _TELEGRAM_NAME.match(value):
        return None
    return "Must be a Telegram chat id (123456789, -1001234567890) or a public channel name (@channel)."
