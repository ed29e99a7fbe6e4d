"""Chat channels end to end: the API, PostgreSQL, RabbitMQ and real Celery workers, each network's real client
against its loopback stand-in (Slack's slack_sdk, Twilio's SDK for WhatsApp, Telegram's Bot API, Teams and Discord
incoming webhooks through the guarded webhook path)."""

from __future__ import annotations

import datetime as dt
import functools
import json
from typing import Any

import pytest

from channels_app.models import SandboxMessage
from notifier.deadletters.models import DeadLetter
from notifier.deliveries.models import Delivery
from preferences.models import Recipient, Suppression
from templates_app.services import template_put
from tests.conftest import wait_for
from tests.stubs.chat import ChatWebhookStub, SlackStub, TelegramStub
from tests.stubs.twilio import TwilioStub

pytest_plugins = ["tests.stubs.fixtures"]

CONTENT_SID = "HX" + "b" * 32
CHAT_PART = {
    "text": "Deploy {{ version }} finished",
    "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "*Deploy* `{{ version }}` finished"}}],
    "content_sid": CONTENT_SID,
    "variables": {"1": "{{ version }}"},
}
CONTENT = {
    "en": {
        "chat": CHAT_PART,
        "email": {"subject": "Deploy {{ version }}", "text": "Deploy {{ version }} finished"},
    }
}
NETWORKS = ["slack", "teams", "discord", "telegram", "whatsapp"]
PROVIDERS = {
    "SLACK_PROVIDERS": "slack",
    "TEAMS_PROVIDERS": "teams",
    "DISCORD_PROVIDERS": "discord",
    "TELEGRAM_PROVIDERS": "telegram",
    "WHATSAPP_PROVIDERS": "twilio_whatsapp",
}
QUEUES = [f"{n}.high" for n in NETWORKS] + ["email.high", "maintenance"]


@pytest.fixture
def template(db: None) -> None:
    template_put(key="deploy", category="transactional", default_locale="en", content=CONTENT)


@pytest.fixture
def loopback_webhooks(settings: Any) -> None:
    """Let this process accept loopback webhook URLs as the workers do (the stand-ins are on loopback)."""
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = True


def _send(api: Any, recipient: dict[str, Any], channels: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"recipient": recipient, "template": "deploy", "payload": {"version": "v1.2"}, **extra}
    if channels is not None:
        body["channels"] = channels
    response = api.post("/api/v1/notifications", body, format="json")
    assert response.status_code == 202, response.content
    return response.json()


def _status(notification_id: str, channel: str, status: str) -> Delivery | None:
    return Delivery.objects.filter(notification_id=notification_id, channel=channel, status=status).first()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("template", "loopback_webhooks")
def test_one_notification_reaches_a_recipient_on_all_five_networks_in_each_ones_form(
    api: Any,
    start_worker: Any,
    slack_stub: SlackStub,
    slack_env: dict[str, str],
    telegram_stub: TelegramStub,
    telegram_env: dict[str, str],
    chat_webhooks: ChatWebhookStub,
    webhook_env: dict[str, str],
    twilio_stub: TwilioStub,
    whatsapp_env: dict[str, str],
) -> None:
    chat = {
        "slack": "U024BE7LH",
        "teams": f"{chat_webhooks.url}/teams/team-1",
        "discord": f"{chat_webhooks.url}/discord/1/tok",
        "telegram": "123456789",
        "whatsapp": "+49 151 12345678",
    }
    put = api.put("/api/v1/recipients/u-chat", {"chat": chat}, format="json")
    assert put.status_code == 201, put.content
    assert put.json()["chat"]["whatsapp"] == "+4915112345678"  # stored in E.164
    start_worker(queues=QUEUES, env={**slack_env, **telegram_env, **webhook_env, **whatsapp_env, **PROVIDERS})

    body = _send(api, {"user_id": "u-chat"}, NETWORKS)
    assert {d["channel"]: d["status"] for d in body["deliveries"]} == dict.fromkeys(NETWORKS, "queued")
    for network in NETWORKS:
        wait_for(functools.partial(_status, body["id"], network, "sent"), 60)

    assert slack_stub.posts() == [
        {"channel": "U024BE7LH", "text": "Deploy v1.2 finished", "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": "*Deploy* `v1.2` finished"}}
        ]}
    ]  # fmt: skip
    (teams,) = chat_webhooks.bodies("teams")
    card = teams["attachments"][0]["content"]
    assert card["type"] == "AdaptiveCard" and card["body"][0]["text"] == "Deploy v1.2 finished"
    (discord,) = chat_webhooks.bodies("discord")
    assert discord["embeds"] == [{"description": "Deploy v1.2 finished"}]
    assert telegram_stub.messages() == [{"chat_id": "123456789", "text": "Deploy v1.2 finished"}]
    (whatsapp,) = twilio_stub.messages()
    assert whatsapp["To"] == "whatsapp:+4915112345678"
    assert whatsapp["ContentSid"] == CONTENT_SID and json.loads(whatsapp["ContentVariables"]) == {"1": "v1.2"}

    detail = api.get(f"/api/v1/notifications/{body['id']}").json()
    providers = {d["channel"]: d["provider"] for d in detail["deliveries"]}
    assert providers == {
        "slack": "slack", "teams": "teams", "discord": "discord", "telegram": "telegram", "whatsapp": "twilio_whatsapp"
    }  # fmt: skip
    slack = next(d for d in detail["deliveries"] if d["channel"] == "slack")
    assert slack["provider_message_id"].startswith("U024BE7LH/")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("template")
def test_slack_429_waits_for_retry_after_then_sends(
    api: Any, start_worker: Any, slack_stub: SlackStub, slack_env: dict[str, str]
) -> None:
    api.put("/api/v1/recipients/u-429", {"chat": {"slack": "U0429TEST"}}, format="json")
    slack_stub.error("ratelimited", status=429, headers={"Retry-After": "3"}, times=1)
    start_worker(queues=QUEUES, env={**slack_env, "SLACK_PROVIDERS": "slack"})
    body = _send(api, {"user_id": "u-429"}, ["slack"])
    sent = wait_for(lambda: _status(body["id"], "slack", "sent"), 60)
    assert sent.attempts == 2
    first, second = [r for r in slack_stub.requests if r.route == "/api/chat.postMessage"]
    # Slack said 3 seconds: the second call came no sooner (the stand-in stamps each request as it arrives).
    assert second.received_at - first.received_at >= 2.9
    assert "ratelimited" in (sent.last_error or "") or any(
        "ratelimited" in d for d in sent.events.values_list("detail", flat=True)
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("template", "loopback_webhooks")
def test_a_dead_teams_webhook_is_dead_lettered(
    api: Any, start_worker: Any, chat_webhooks: ChatWebhookStub, webhook_env: dict[str, str]
) -> None:
    url = f"{chat_webhooks.url}/teams/dead"
    api.put("/api/v1/recipients/u-dead", {"chat": {"teams": url}}, format="json")
    chat_webhooks.respond(503, "Service Unavailable")
    env = {**webhook_env, "TEAMS_PROVIDERS": "teams", "DELIVERY_MAX_ATTEMPTS": "2", "RETRY_BACKOFF_BASE_SECONDS": "0.2"}
    start_worker(queues=QUEUES, env=env)
    body = _send(api, {"user_id": "u-dead"}, ["teams"])
    failed = wait_for(lambda: _status(body["id"], "teams", "failed"), 60)
    assert failed.attempts == 2
    assert DeadLetter.objects.filter(delivery_id=failed.pk, channel="teams").exists()
    listed = api.get("/api/v1/dead-letters", {"channel": "teams"}).json()
    assert [item["delivery_id"] for item in listed["results"]] == [failed.pk]
    assert len(chat_webhooks.bodies("teams")) == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("template")
def test_fallback_from_slack_to_email(api: Any, start_worker: Any, slack_stub: SlackStub, slack_env: dict) -> None:
    api.put("/api/v1/recipients/u-fb", {"chat": {"slack": "C0ARCHIVED"}, "email": "fb@example.com"}, format="json")
    slack_stub.error("is_archived")
    start_worker(queues=QUEUES, env={**slack_env, "SLACK_PROVIDERS": "slack"})
    body = _send(api, {"user_id": "u-fb"}, ["slack", "email"], strategy="fallback")
    assert {d["channel"]: d["status"] for d in body["deliveries"]} == {"slack": "queued", "email": "pending"}
    email = wait_for(lambda: _status(body["id"], "email", "sent"), 60)
    assert _status(body["id"], "slack", "failed") is not None
    (message,) = SandboxMessage.objects.filter(delivery_id=email.pk)
    assert message.address == "fb@example.com" and message.content["subject"] == "Deploy v1.2"
    # Slack said the channel is archived: the address is suppressed for the next send.
    assert Suppression.objects.filter(channel="slack", address="C0ARCHIVED").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("template")
def test_a_channel_address_without_a_recipient(
    api: Any, start_worker: Any, slack_stub: SlackStub, slack_env: dict[str, str]
) -> None:
    # Quiet hours and an opt-out on some user change nothing: no user, no preferences.
    start_worker(queues=QUEUES, env={**slack_env, "SLACK_PROVIDERS": "slack"})
    body = _send(api, {"chat": {"slack": "#ops"}})
    assert [(d["channel"], d["status"]) for d in body["deliveries"]] == [("slack", "queued")]
    wait_for(lambda: _status(body["id"], "slack", "sent"), 60)
    assert slack_stub.posts()[0]["channel"] == "#ops"
    detail = api.get(f"/api/v1/notifications/{body['id']}").json()
    assert detail["user_id"] is None
    assert [d.address for d in Delivery.objects.filter(notification_id=body["id"])] == ["#ops"]
    # The holder of channel addresses is no recipient a caller sees.
    assert api.get("/api/v1/recipients").json()["results"] == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("template")
def test_a_test_key_sends_chat_to_the_sandbox(
    api_client_factory: Any, start_worker: Any, slack_stub: SlackStub, slack_env: dict[str, str]
) -> None:
    _, http = api_client_factory(mode="test")
    # The test environment has templates of its own.
    put = http.put(
        "/api/v1/templates/deploy",
        {"category": "transactional", "default_locale": "en", "content": CONTENT},
        format="json",
    )
    assert put.status_code == 201, put.content
    start_worker(queues=QUEUES, env={**slack_env, "SLACK_PROVIDERS": "slack"})
    body = _send(http, {"chat": {"slack": "#ops"}})
    delivery = wait_for(lambda: _status(body["id"], "slack", "sent"), 60)
    assert delivery.provider == "sandbox"
    (message,) = SandboxMessage.objects.filter(delivery_id=delivery.pk)
    assert message.channel == "slack" and message.content["text"] == "Deploy v1.2 finished"
    assert slack_stub.posts() == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("chat", "field"),
    [
        ({"slack": "not an id"}, "slack"),
        ({"telegram": "12ab"}, "telegram"),
        ({"whatsapp": "+10000000000"}, "whatsapp"),
        ({"teams": "ftp://example.com/hook"}, "teams"),
        ({"discord": "http://169.254.169.254/latest"}, "discord"),
        ({"signal": "+4915112345678"}, "signal"),
    ],
)
def test_bad_chat_addresses_are_400_naming_the_network(api: Any, chat: dict[str, str], field: str) -> None:
    response = api.put("/api/v1/recipients/u-bad", {"chat": chat}, format="json")
    assert response.status_code == 400
    assert f"chat.{field}" in response.json()["error"]["fields"]
    assert not Recipient.objects.filter(user_id="u-bad").exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("template")
def test_a_chat_address_send_is_checked_like_any_other(api: Any) -> None:
    both = api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": "u", "chat": {"slack": "#ops"}}, "template": "deploy"},
        format="json",
    )
    assert both.status_code == 400 and "recipient.user_id" in both.json()["error"]["fields"]
    bad = api.post(
        "/api/v1/notifications", {"recipient": {"chat": {"slack": "ops"}}, "template": "deploy"}, format="json"
    )
    assert bad.status_code == 400 and "recipient.chat.slack" in bad.json()["error"]["fields"]


@pytest.mark.django_db
def test_the_chat_part_is_validated_and_previewed(api: Any) -> None:
    bad = api.put(
        "/api/v1/templates/bad-chat",
        {"category": "transactional", "default_locale": "en", "content": {"en": {"chat": {"blocks": {"x": 1}}}}},
        format="json",
    )
    assert bad.status_code == 400
    assert set(bad.json()["error"]["fields"]) >= {"content.en.chat.blocks", "content.en.chat"}
    good = api.put(
        "/api/v1/templates/deploy",
        {"category": "transactional", "default_locale": "en", "content": CONTENT},
        format="json",
    )
    assert good.status_code == 201, good.content
    preview = api.post("/api/v1/templates/deploy/preview", {"payload": {"version": "v9"}}, format="json")
    assert preview.status_code == 200, preview.content
    channels = preview.json()["channels"]
    assert set(NETWORKS) <= set(channels)
    assert channels["slack"]["parts"]["blocks"][0]["text"]["text"] == "*Deploy* `v9` finished"
    assert channels["whatsapp"]["parts"]["variables"] == {"1": "v9"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("template")
def test_a_users_preferences_and_quiet_hours_apply_to_their_chat(
    api: Any, start_worker: Any, slack_stub: SlackStub, slack_env: dict[str, str]
) -> None:
    template_put(key="promo", category="marketing", default_locale="en", content={"en": {"chat": CHAT_PART}})
    now = dt.datetime.now(dt.UTC)
    around_now = {"start": f"{(now - dt.timedelta(hours=1)):%H:%M}", "end": f"{(now + dt.timedelta(hours=1)):%H:%M}"}
    preferences = {
        "u-on": {},
        "u-off": {"channels": {"slack": False}},
        "u-email-only": {"categories": {"marketing": {"enabled": True, "channels": ["email"]}}},
        "u-quiet": {"quiet_hours": around_now},
        "u-late": {},
    }
    for n, (user, prefs) in enumerate(preferences.items()):
        assert (
            api.put(f"/api/v1/recipients/{user}", {"chat": {"slack": f"U0PREF00{n}"}}, format="json").status_code == 201
        )
        assert api.put(f"/api/v1/recipients/{user}/preferences", prefs, format="json").status_code == 200

    def promo(user: str) -> dict[str, Any]:
        (delivery,) = _send(api, {"user_id": user}, ["slack"], template="promo")["deliveries"]
        return {"id": delivery["id"], "status": delivery["status"]}

    sent = {user: promo(user) for user in preferences}
    # Decided at accept: the opted-out channel and category are suppressed, quiet hours defer to the window's end.
    assert {user: d["status"] for user, d in sent.items()} == {
        "u-on": "queued", "u-off": "suppressed", "u-email-only": "suppressed", "u-quiet": "deferred", "u-late": "queued"
    }  # fmt: skip
    reasons = dict(Delivery.objects.filter(pk__in=[d["id"] for d in sent.values()]).values_list("pk", "reason"))
    assert reasons[sent["u-off"]["id"]] == "channel_disabled"
    assert reasons[sent["u-email-only"]["id"]] == "category_disabled"
    assert reasons[sent["u-quiet"]["id"]] == "quiet_hours"
    quiet = Delivery.objects.get(pk=sent["u-quiet"]["id"])
    assert quiet.not_before is not None and quiet.not_before > now + dt.timedelta(minutes=50)
    # Decided again at send: u-late opts out of Slack after the accept, before any worker takes it.
    assert (
        api.put("/api/v1/recipients/u-late/preferences", {"channels": {"slack": False}}, format="json").status_code
        == 200
    )
    # A transactional message reaches the user in quiet hours all the same.
    (deploy,) = _send(api, {"user_id": "u-quiet"}, ["slack"])["deliveries"]

    # Marketing goes on the low queues.
    start_worker(queues=[*QUEUES, "slack.low"], env={**slack_env, "SLACK_PROVIDERS": "slack"})
    ids = [sent["u-on"]["id"], deploy["id"], sent["u-late"]["id"]]

    def settled() -> list[tuple[int, str, str]]:
        found = list(Delivery.objects.filter(pk__in=ids).order_by("pk").values_list("pk", "status", "reason"))
        return found if all(status in ("sent", "suppressed", "failed") for _, status, _ in found) else []

    try:
        wait_for(settled, 60)
    except AssertionError:
        found = Delivery.objects.filter(pk__in=ids).order_by("pk").values_list("status", "reason", "last_error")
        raise AssertionError(list(found)) from None
    late = Delivery.objects.get(pk=sent["u-late"]["id"])
    assert [Delivery.objects.get(pk=pk).status for pk in ids[:2]] == ["sent", "sent"]
    assert (late.status, late.reason) == ("suppressed", "channel_disabled")
    assert sorted(p["channel"] for p in slack_stub.posts()) == ["U0PREF000", "U0PREF003"]
    assert Delivery.objects.get(pk=sent["u-quiet"]["id"]).status == "deferred"
