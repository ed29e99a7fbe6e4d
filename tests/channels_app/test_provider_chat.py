"""The chat providers with their real clients against loopback stand-ins: what goes on the wire, how answers sort.

Slack through the official slack_sdk WebClient, WhatsApp through the twilio SDK, Telegram's Bot API, Teams and
Discord incoming webhooks through the guarded webhook path.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from channels_app.providers.base import ConfigurationError, OutboundMessage, PermanentError, RetriableError
from channels_app.providers.chat_webhooks import DiscordProvider, TeamsProvider
from channels_app.providers.slack import SlackProvider
from channels_app.providers.telegram import TelegramProvider
from channels_app.providers.twilio_sms import TwilioWhatsAppProvider
from tests.stubs.chat import ChatWebhookStub, SlackStub, TelegramStub
from tests.stubs.config import configure_settings
from tests.stubs.twilio import TwilioStub

pytest_plugins = ["tests.stubs.fixtures"]

BLOCKS = [{"type": "section", "text": {"type": "mrkdwn", "text": "*Deploy* finished"}}]


def chat(channel: str, address: str, **content: Any) -> OutboundMessage:
    parts = {"text": "Deploy finished", "blocks": [], "card": {}, "embed": {}, "content_sid": "", "variables": {}}
    return OutboundMessage(
        delivery_id=7, channel=channel, address=address, content={**parts, **content}, idempotency_key="dlv_7"
    )


# --- Slack ------------------------------------------------------------------------------------------------------


@pytest.fixture
def slack(settings: Any, slack_env: dict[str, str]) -> SlackProvider:
    configure_settings(settings, slack_env)
    return SlackProvider.from_settings()


def test_slack_posts_text_and_blocks_with_the_bot_token(slack: SlackProvider, slack_stub: SlackStub) -> None:
    result = slack.send(chat("slack", "U024BE7LH", blocks=BLOCKS))
    (body,) = slack_stub.posts()
    assert body == {"channel": "U024BE7LH", "text": "Deploy finished", "blocks": BLOCKS}
    channel, _, ts = result.provider_message_id.partition("/")
    assert channel == "U024BE7LH" and float(ts) > 0


def test_slack_without_blocks_sends_text_only(slack: SlackProvider, slack_stub: SlackStub) -> None:
    slack.send(chat("slack", "#ops"))
    assert slack_stub.posts() == [{"channel": "#ops", "text": "Deploy finished"}]


def test_slack_429_is_throttled_with_retry_after(slack: SlackProvider, slack_stub: SlackStub) -> None:
    slack_stub.error("ratelimited", status=429, headers={"Retry-After": "7"})
    with pytest.raises(RetriableError) as info:
        slack.send(chat("slack", "C024BE91L"))
    assert info.value.throttled and info.value.retry_after == 7.0 and info.value.code == "ratelimited"


def test_slack_ratelimited_error_in_a_200_is_throttled(slack: SlackProvider, slack_stub: SlackStub) -> None:
    slack_stub.error("ratelimited")
    with pytest.raises(RetriableError) as info:
        slack.send(chat("slack", "C024BE91L"))
    assert info.value.throttled


@pytest.mark.parametrize(
    ("error", "suppress"), [("channel_not_found", True), ("is_archived", True), ("msg_too_long", False)]
)
def test_slack_permanent_errors(slack: SlackProvider, slack_stub: SlackStub, error: str, suppress: bool) -> None:
    slack_stub.error(error)
    with pytest.raises(PermanentError) as info:
        slack.send(chat("slack", "C024BE91L"))
    assert info.value.code == error and info.value.suppress is suppress


def test_slack_wrong_token_is_retried_not_failed(settings: Any, slack_env: dict[str, str], slack_stub: Any) -> None:
    configure_settings(settings, {**slack_env, "SLACK_BOT_TOKEN": "xoxb-wrong"})
    with pytest.raises(RetriableError) as info:
        SlackProvider.from_settings().send(chat("slack", "C024BE91L"))
    assert info.value.code == "invalid_auth" and not info.value.throttled


def test_slack_5xx_and_refused_connections_are_retriable(slack: SlackProvider, slack_stub: SlackStub) -> None:
    slack_stub.respond(503, "<html>down</html>", times=1)
    with pytest.raises(RetriableError) as info:
        slack.send(chat("slack", "C024BE91L"))
    assert not info.value.throttled
    slack_stub.stop()
    with pytest.raises(RetriableError) as refused:
        slack.send(chat("slack", "C024BE91L"))
    assert refused.value.code == "connection_error" and not refused.value.maybe_sent


def test_slack_needs_its_token(settings: Any) -> None:
    configure_settings(settings, {"SLACK_BOT_TOKEN": ""})
    with pytest.raises(ConfigurationError, match="SLACK_BOT_TOKEN"):
        SlackProvider.from_settings()


# --- Teams and Discord --------------------------------------------------------------------------------------------


@pytest.fixture
def hooks_env(settings: Any, webhook_env: dict[str, str]) -> None:
    configure_settings(settings, webhook_env)
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = True  # the stand-in is on loopback


def test_teams_gets_an_adaptive_card_built_from_text(hooks_env: None, chat_webhooks: ChatWebhookStub) -> None:
    TeamsProvider.from_settings().send(chat("teams", f"{chat_webhooks.url}/teams/abc"))
    (body,) = chat_webhooks.bodies("teams")
    (attachment,) = body["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert attachment["content"]["body"] == [{"type": "TextBlock", "text": "Deploy finished", "wrap": True}]


def test_teams_sends_the_parts_own_card(hooks_env: None, chat_webhooks: ChatWebhookStub) -> None:
    card = {"type": "AdaptiveCard", "version": "1.5", "body": [{"type": "TextBlock", "text": "Custom"}]}
    TeamsProvider.from_settings().send(chat("teams", f"{chat_webhooks.url}/teams/abc", card=card))
    assert chat_webhooks.bodies("teams")[0]["attachments"][0]["content"] == card


def test_discord_gets_an_embed_and_its_message_id(hooks_env: None, chat_webhooks: ChatWebhookStub) -> None:
    result = DiscordProvider.from_settings().send(chat("discord", f"{chat_webhooks.url}/discord/1/tok"))
    (request,) = chat_webhooks.requests
    assert request.path.endswith("?wait=true")
    assert request.json() == {"allowed_mentions": {"parse": []}, "embeds": [{"description": "Deploy finished"}]}
    assert result.provider_message_id.startswith("11")


def test_discord_sends_the_parts_own_embed(hooks_env: None, chat_webhooks: ChatWebhookStub) -> None:
    embed = {"title": "Deploy", "color": 3066993}
    DiscordProvider.from_settings().send(chat("discord", f"{chat_webhooks.url}/discord/1/tok", embed=embed))
    body = chat_webhooks.bodies("discord")[0]
    assert body["embeds"] == [embed] and body["content"] == "Deploy finished"


def test_deleted_chat_webhook_is_permanent_and_suppressed(hooks_env: None, chat_webhooks: ChatWebhookStub) -> None:
    with pytest.raises(PermanentError) as info:
        DiscordProvider.from_settings().send(chat("discord", f"{chat_webhooks.url}/gone/1"))
    assert info.value.suppress and info.value.code == "http_404"


def test_chat_webhook_429_and_5xx(hooks_env: None, chat_webhooks: ChatWebhookStub) -> None:
    url = f"{chat_webhooks.url}/teams/abc"
    chat_webhooks.respond(429, {"retry_after": 2}, headers={"Retry-After": "2"}, times=1)
    with pytest.raises(RetriableError) as throttled:
        TeamsProvider.from_settings().send(chat("teams", url))
    assert throttled.value.throttled and throttled.value.retry_after == 2.0
    chat_webhooks.respond(502, "bad gateway", times=1)
    with pytest.raises(RetriableError) as failing:
        TeamsProvider.from_settings().send(chat("teams", url))
    assert not failing.value.throttled


def test_chat_webhooks_go_through_the_ssrf_guard(settings: Any, chat_webhooks: ChatWebhookStub) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = False
    with pytest.raises(PermanentError) as info:
        TeamsProvider.from_settings().send(chat("teams", f"{chat_webhooks.url}/teams/abc"))
    assert info.value.code == "unsafe_target"
    assert chat_webhooks.requests == []


# --- Telegram -----------------------------------------------------------------------------------------------------


@pytest.fixture
def telegram(settings: Any, telegram_env: dict[str, str]) -> TelegramProvider:
    configure_settings(settings, telegram_env)
    return TelegramProvider.from_settings()


def test_telegram_sends_text_to_the_chat_id(telegram: TelegramProvider, telegram_stub: TelegramStub) -> None:
    result = telegram.send(chat("telegram", "123456789"))
    assert telegram_stub.messages() == [{"chat_id": "123456789", "text": "Deploy finished"}]
    assert result.provider_message_id == "123456789/1"


def test_telegram_429_honours_retry_after(telegram: TelegramProvider, telegram_stub: TelegramStub) -> None:
    telegram_stub.respond(
        429,
        {
            "ok": False,
            "error_code": 429,
            "description": "Too Many Requests: retry after 5",
            "parameters": {"retry_after": 5},
        },
    )
    with pytest.raises(RetriableError) as info:
        telegram.send(chat("telegram", "123456789"))
    assert info.value.throttled and info.value.retry_after == 5.0


def test_telegram_blocked_bot_suppresses_the_chat(telegram: TelegramProvider, telegram_stub: TelegramStub) -> None:
    telegram_stub.respond(
        403, {"ok": False, "error_code": 403, "description": "Forbidden: bot was blocked by the user"}
    )
    with pytest.raises(PermanentError) as info:
        telegram.send(chat("telegram", "123456789"))
    assert info.value.suppress


def test_telegram_errors_never_carry_the_token(
    settings: Any, telegram_env: dict[str, str], telegram_stub: TelegramStub
) -> None:
    telegram_stub.stop()
    configure_settings(settings, telegram_env)
    with pytest.raises(RetriableError) as info:
        TelegramProvider.from_settings().send(chat("telegram", "123456789"))
    assert "stub-telegram-token" not in str(info.value)


# --- WhatsApp through Twilio --------------------------------------------------------------------------------------


@pytest.fixture
def whatsapp(settings: Any, whatsapp_env: dict[str, str]) -> TwilioWhatsAppProvider:
    configure_settings(settings, whatsapp_env)
    return TwilioWhatsAppProvider.from_settings()


def test_whatsapp_template_with_content_sid_and_variables(
    whatsapp: TwilioWhatsAppProvider, twilio_stub: TwilioStub
) -> None:
    sid = "HX" + "a" * 32
    result = whatsapp.send(chat("whatsapp", "+4915112345678", content_sid=sid, variables={"1": "A-1001"}))
    (form,) = twilio_stub.messages()
    assert form["To"] == "whatsapp:+4915112345678" and form["From"] == "whatsapp:+14155238886"
    assert form["ContentSid"] == sid and json.loads(form["ContentVariables"]) == {"1": "A-1001"}
    assert "Body" not in form
    assert result.provider_message_id.startswith("SM")


def test_whatsapp_session_message_sends_text(whatsapp: TwilioWhatsAppProvider, twilio_stub: TwilioStub) -> None:
    whatsapp.send(chat("whatsapp", "+4915112345678"))
    (form,) = twilio_stub.messages()
    assert form["Body"] == "Deploy finished" and "ContentSid" not in form


def test_whatsapp_outside_the_session_window_is_permanent(
    whatsapp: TwilioWhatsAppProvider, twilio_stub: TwilioStub
) -> None:
    twilio_stub.fail(400, 63016)
    with pytest.raises(PermanentError) as info:
        whatsapp.send(chat("whatsapp", "+4915112345678"))
    assert info.value.code == "63016" and not info.value.suppress
