"""A project's sending settings reach its deliveries: sender identities, default layout, provider accounts.

Real workers send through the real provider SDKs to local stand-ins (tests/stubs): what each stand-in received
(the From and Reply-To of an email, the sender of an SMS, which account's server got which message) is what is
checked. Project A sets everything, project B nothing: B's deliveries keep the installation's.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from channels_app import breaker
from notifier.deadletters.models import DeadLetter
from notifier.deliveries.models import Delivery
from projects.models import Project
from projects.services import project_create
from tests.conftest import wait_for
from tests.projects.test_promotion_admin import _inline
from tests.stubs import aws, twilio
from tests.stubs.chat import SLACK_TOKEN, TELEGRAM_TOKEN, SlackStub, TelegramStub
from tests.stubs.config import EMAIL_FROM, SMS_FROM
from tests.stubs.smtp import SmtpStub
from tests.stubs.twilio import TwilioStub

CONTENT = {
    "en": {
        "email": {"subject": "Order {{ order }}", "text": "Shipped {{ order }}", "html": "<p>Shipped {{ order }}</p>"},
        "sms": {"text": "Order {{ order }} shipped"},
        "chat": {"text": "Order {{ order }} shipped"},
    }
}
SHOP_FROM = "Shop <hello@shop.example>"
SHOP_REPLY_TO = "help@shop.example"
SHOP_SMS = "+15005550077"


@pytest.fixture
def projects(api_client_factory: Any) -> dict[str, tuple[Any, Any]]:
    """Project A (every sending setting) and B (none), each with a live key, a template and a recipient."""
    shop = project_create(slug="shop")
    project_create(slug="other")
    shop.email_from, shop.email_reply_to, shop.sms_sender = SHOP_FROM, SHOP_REPLY_TO, SHOP_SMS
    shop.save()  # through the model: the configuration cache of every process is invalidated
    keys = {"a": api_client_factory(project="shop"), "b": api_client_factory(project="other")}
    for name, (_, api) in keys.items():
        body = {"category": "transactional", "default_locale": "en", "content": CONTENT}
        assert api.put("/api/v1/templates/shipped", body, format="json").status_code == 201
        person = {"email": f"{name}@example.com", "phone": "+1415555010" + ("1" if name == "a" else "2")}
        assert api.put("/api/v1/recipients/u-1", person, format="json").status_code == 201
    return keys


def _send(api: Any, channel: str, order: str = "A-1") -> int:
    body = {"recipient": {"user_id": "u-1"}, "template": "shipped", "channels": [channel], "payload": {"order": order}}
    answer = api.post("/api/v1/notifications", body, format="json")
    assert answer.status_code == 202, answer.content
    return int(Delivery.objects.get(notification_id=answer.json()["id"], channel=channel).pk)


def _sent(*ids: int, timeout: float = 60) -> list[Delivery]:
    found = wait_for(lambda: len(Delivery.objects.filter(pk__in=ids, status="sent")) == len(ids), timeout)
    assert found, list(Delivery.objects.filter(pk__in=ids).values_list("status", "last_error"))
    return sorted(Delivery.objects.filter(pk__in=ids), key=lambda d: ids.index(d.pk))


@pytest.mark.django_db(transaction=True)
def test_smtp_and_twilio_see_the_projects_sender_identities(
    projects: dict[str, tuple[Any, Any]],
    start_worker: Any,
    smtp_stub: Any,
    smtp_env: dict[str, str],
    twilio_stub: Any,
    twilio_env: dict[str, str],
) -> None:
    start_worker(env={**smtp_env, **twilio_env, "EMAIL_PROVIDERS": "smtp", "SMS_PROVIDERS": "twilio"})
    (_, a), (_, b) = projects["a"], projects["b"]
    _sent(_send(a, "email"), _send(b, "email"), _send(a, "sms"), _send(b, "sms"))

    mails = {mail.rcpt_tos[0]: mail.message for mail in smtp_stub.messages}
    assert (mails["a@example.com"]["From"], mails["a@example.com"]["Reply-To"]) == (SHOP_FROM, SHOP_REPLY_TO)
    assert (mails["b@example.com"]["From"], mails["b@example.com"]["Reply-To"]) == (EMAIL_FROM, None)
    # The Message-ID is made in the sender's domain.
    assert mails["a@example.com"]["Message-ID"].endswith("@shop.example>")
    senders = {m["To"]: m["From"] for m in twilio_stub.messages()}
    assert senders == {"+14155550101": SHOP_SMS, "+14155550102": SMS_FROM}


@pytest.mark.django_db(transaction=True)
def test_ses_and_sns_see_the_projects_sender_identities(
    projects: dict[str, tuple[Any, Any]], start_worker: Any, moto_server: Any, aws_stub: Any, aws_env: dict[str, str]
) -> None:
    session = boto3.session.Session(
        aws_access_key_id=aws.ACCESS_KEY, aws_secret_access_key=aws.SECRET_KEY, region_name=aws.REGION
    )
    ses = session.client("sesv2", endpoint_url=moto_server.url)
    for identity in ("shop.example", "notifier.test"):  # SES sends only from verified identities
        ses.create_email_identity(EmailIdentity=identity)
    # An alphanumeric sender id this time: SNS takes it as the SenderID (a number would be the origination number).
    shop = Project.objects.get(slug="shop")
    shop.sms_sender = "SHOP"
    shop.save()
    env = {**aws_env, "EMAIL_PROVIDERS": "ses", "SMS_PROVIDERS": "sns", "SNS_SENDER_ID": "NOTIFIER"}
    start_worker(env=env)
    (_, a), (_, b) = projects["a"], projects["b"]
    _sent(_send(a, "email"), _send(b, "email"), _send(a, "sms"), _send(b, "sms"))

    sends = {json.loads(r.body)["Destination"]["ToAddresses"][0]: json.loads(r.body) for r in aws_stub.ses_sends()}
    assert sends["a@example.com"]["FromEmailAddress"] == SHOP_FROM
    assert sends["a@example.com"]["ReplyToAddresses"] == [SHOP_REPLY_TO]
    assert sends["b@example.com"]["FromEmailAddress"] == EMAIL_FROM
    assert "ReplyToAddresses" not in sends["b@example.com"]
    sender_ids = {}
    for form in aws_stub.sns_publishes():
        attributes = {
            form[key]: form[key.replace(".Name", ".Value.StringValue")]
            for key in form
            if key.startswith("MessageAttributes.entry.") and key.endswith(".Name")
        }
        sender_ids[form["PhoneNumber"]] = attributes.get("AWS.SNS.SMS.SenderID")
    assert sender_ids == {"+14155550101": "SHOP", "+14155550102": "NOTIFIER"}


@pytest.mark.django_db(transaction=True)
def test_an_email_whose_template_names_no_layout_is_wrapped_in_the_projects_default_layout(
    api_client_factory: Any, start_worker: Any
) -> None:
    shop = project_create(slug="shop")
    project_create(slug="other")
    shop.default_layout = "brand"
    shop.save()
    keys = {
        "a_test": api_client_factory(project="shop", mode="test"),
        "b_test": api_client_factory(project="other", mode="test"),
    }
    for name, (_, api) in keys.items():
        # Each environment has a layout `brand` of its own: the project's default is looked up in the delivery's.
        layout = {"html": f"<main data-env='{name}'>{{{{ content }}}}</main>", "text": f"{name} | {{{{ content }}}}"}
        assert api.put("/api/v1/layouts/brand", layout, format="json").status_code == 201
        body = {"category": "transactional", "default_locale": "en", "content": CONTENT}
        assert api.put("/api/v1/templates/shipped", body, format="json").status_code == 201
        assert api.put("/api/v1/recipients/u-1", {"email": f"{name}@example.com"}, format="json").status_code == 201
    start_worker(queues=["email.high", "email.low"])
    ids = [_send(api, "email") for _, api in keys.values()]
    _sent(*ids)

    for name, (_, api) in keys.items():
        answer = api.get("/api/v1/sandbox/messages", {"channel": "email"})
        [email] = answer.json()["results"]
        if name == "a_test":  # the project's default layout, of its own test environment
            assert any(f"data-env={q}a_test{q}" in email["content"]["html"] for q in "'\"")
            assert "<p>Shipped A-1</p>" in email["content"]["html"]
            assert email["content"]["text"].startswith("a_test | Shipped A-1")
        else:  # project B names no default layout: the template's HTML as it is
            assert "<main" not in email["content"]["html"] and "<p>Shipped A-1</p>" in email["content"]["html"]
            assert email["content"]["text"].startswith("Shipped A-1")


@pytest.mark.django_db(transaction=True)
def test_a_projects_provider_accounts_carry_only_its_traffic_with_breakers_of_their_own(
    projects: dict[str, tuple[Any, Any]],
    start_worker: Any,
    smtp_stub: Any,
    smtp_env: dict[str, str],
    twilio_stub: Any,
    twilio_env: dict[str, str],
) -> None:
    shop_smtp = SmtpStub().start()
    with TwilioStub() as shop_twilio:
        try:
            accounts = {
                "shop-mail": {"provider": "smtp", "host": shop_smtp.host, "port": shop_smtp.port},
                "shop-sms": {
                    "provider": "twilio",
                    "account_sid": twilio.ACCOUNT_SID,
                    "auth_token": twilio.AUTH_TOKEN,
                    "base_url": shop_twilio.url,
                },
            }
            shop = Project.objects.get(slug="shop")
            shop.provider_accounts = {"email": "shop-mail", "sms": "shop-sms"}
            shop.save()
            env = {
                **smtp_env,
                **twilio_env,
                "EMAIL_PROVIDERS": "smtp",
                "SMS_PROVIDERS": "twilio",
                "PROVIDER_ACCOUNTS": json.dumps(accounts),
                # A breaker that opens after two failed calls, and stays open for the rest of the test.
                "PROVIDER_CIRCUIT_BREAKERS": json.dumps(
                    {"default": {"min_calls": 2, "failure_threshold": 0.5, "cooldown_seconds": 600}}
                ),
                "RETRY_BACKOFF_BASE_SECONDS": "0.5",
            }
            start_worker(env=env)
            (_, a), (_, b) = projects["a"], projects["b"]
            a_mail, b_mail, a_sms, b_sms = _send(a, "email"), _send(b, "email"), _send(a, "sms"), _send(b, "sms")
            sent = _sent(a_mail, b_mail, a_sms, b_sms)
            assert [d.provider for d in sent] == ["shop-mail", "smtp", "shop-sms", "twilio"]

            # Each stand-in saw its own project's traffic only, with that project's sender.
            assert [m.rcpt_tos for m in shop_smtp.messages] == [["a@example.com"]]
            assert shop_smtp.messages[0].message["From"] == SHOP_FROM
            assert [m.rcpt_tos for m in smtp_stub.messages] == [["b@example.com"]]
            assert [(m["To"], m["From"]) for m in shop_twilio.messages()] == [("+14155550101", SHOP_SMS)]
            assert [(m["To"], m["From"]) for m in twilio_stub.messages()] == [("+14155550102", SMS_FROM)]

            # The project's SMS account goes down: its breaker opens, the installation's stays closed, and the
            # other project's SMS keep going out through the installation's account.
            shop_twilio.fail(503, 20500)
            failing = [_send(a, "sms", order=f"F-{n}") for n in range(3)]
            wait_for(lambda: breaker.state("shop-sms") == breaker.OPEN, 60)
            later = _sent(_send(b, "sms", order="B-2"))
            assert later[0].provider == "twilio"
            assert breaker.state("twilio") == breaker.CLOSED
            # A's deliveries wait for their own account (never the installation's): none is sent elsewhere.
            waiting = Delivery.objects.filter(pk__in=failing)
            assert not waiting.filter(status="sent").exists()
            assert set(waiting.values_list("provider", flat=True)) <= {"shop-sms", ""}
            assert [m["To"] for m in twilio_stub.messages()] == ["+14155550102", "+14155550102"]
        finally:
            shop_smtp.stop()


# The shop's own Slack workspace bot, Telegram bot and Twilio account (for WhatsApp): its chat goes through them.
SHOP_SLACK_TOKEN = "xoxb-shop-workspace-bot"
SHOP_TELEGRAM_TOKEN = "777000:shop-telegram-bot"
SHOP_TWILIO_SID, SHOP_TWILIO_TOKEN = "AC" + "5" * 32, "shop-twilio-token"
SHOP_WHATSAPP_FROM = "+15005550088"
OTHER_SLACK_TOKEN = "xoxb-other-workspace-bot"
CHAT_ADDRESSES = {
    "a": {"slack": "U0SHOP0001", "telegram": "1001", "whatsapp": "+14155550101"},
    "b": {"slack": "U0OTHER001", "telegram": "2002", "whatsapp": "+14155550102"},
}


def _deferred(ids: list[int]) -> list[str]:
    from notifier.deliveries.models import DeliveryEvent

    return list(DeliveryEvent.objects.filter(delivery_id__in=ids, status="deferred").values_list("detail", flat=True))


@pytest.mark.django_db(transaction=True)
def test_a_projects_own_slack_telegram_and_whatsapp_accounts_carry_only_its_chat(
    projects: dict[str, tuple[Any, Any]],
    start_worker: Any,
    slack_stub: SlackStub,
    slack_env: dict[str, str],
    telegram_stub: TelegramStub,
    telegram_env: dict[str, str],
    twilio_stub: TwilioStub,
    whatsapp_env: dict[str, str],
) -> None:
    # One stand-in per network knows both bots (both Twilio accounts): which credentials each call carried is
    # what tells the installation's from the project's. The accounts name no endpoint: they inherit it.
    slack_stub.tokens.add(SHOP_SLACK_TOKEN)
    telegram_stub.tokens.add(SHOP_TELEGRAM_TOKEN)
    twilio_stub.accounts[SHOP_TWILIO_SID] = SHOP_TWILIO_TOKEN
    accounts = {
        "shop-slack": {"provider": "slack", "bot_token": SHOP_SLACK_TOKEN},
        "shop-telegram": {"provider": "telegram", "bot_token": SHOP_TELEGRAM_TOKEN},
        "shop-whatsapp": {
            "provider": "twilio_whatsapp",
            "account_sid": SHOP_TWILIO_SID,
            "auth_token": SHOP_TWILIO_TOKEN,
            "from_number": SHOP_WHATSAPP_FROM,
        },
    }
    shop = Project.objects.get(slug="shop")
    shop.provider_accounts = {"slack": "shop-slack", "telegram": "shop-telegram", "whatsapp": "shop-whatsapp"}
    shop.save()
    for name, (_, api) in projects.items():
        answer = api.put("/api/v1/recipients/u-1", {"chat": CHAT_ADDRESSES[name]}, format="json")
        assert answer.status_code in (200, 201), answer.content
    env = {
        **slack_env,
        **telegram_env,
        **whatsapp_env,
        "SLACK_PROVIDERS": "slack",
        "TELEGRAM_PROVIDERS": "telegram",
        "WHATSAPP_PROVIDERS": "twilio_whatsapp",
        "PROVIDER_ACCOUNTS": json.dumps(accounts),
        # The shop's Slack bot may post once every two seconds; the installation's keeps its default rate.
        "PROVIDER_RATE_LIMITS": json.dumps({"shop-slack": {"rate": 0.5, "burst": 1, "high_reserve": 0}}),
        "PROVIDER_CIRCUIT_BREAKERS": json.dumps(
            {"default": {"min_calls": 2, "failure_threshold": 0.5, "cooldown_seconds": 600}}
        ),
        "RETRY_BACKOFF_BASE_SECONDS": "0.5",
    }
    start_worker(queues=["slack.high", "telegram.high", "whatsapp.high", "maintenance"], env=env)
    (_, a), (_, b) = projects["a"], projects["b"]
    networks = ["slack", "telegram", "whatsapp"]
    sent = _sent(*[_send(a, network) for network in networks], *[_send(b, network) for network in networks])
    assert [d.provider for d in sent] == [
        "shop-slack", "shop-telegram", "shop-whatsapp", "slack", "telegram", "twilio_whatsapp"
    ]  # fmt: skip

    # Each network saw each project's own credentials: Slack the bearer token, Telegram the token in the path,
    # Twilio the account in the URL (and its Basic auth, which the stand-in checked) with that account's sender.
    assert slack_stub.tokens_by_channel() == {"U0SHOP0001": SHOP_SLACK_TOKEN, "U0OTHER001": SLACK_TOKEN}
    assert telegram_stub.tokens_by_chat() == {"1001": SHOP_TELEGRAM_TOKEN, "2002": TELEGRAM_TOKEN}
    whatsapp = {r.form()["To"]: (twilio_stub.account_of(r), r.form()["From"]) for r in twilio_stub.requests}
    assert whatsapp == {
        "whatsapp:+14155550101": (SHOP_TWILIO_SID, f"whatsapp:{SHOP_WHATSAPP_FROM}"),
        "whatsapp:+14155550102": (twilio.ACCOUNT_SID, "whatsapp:+14155238886"),
    }

    # The account's own rate-limit bucket: the shop's next Slack messages wait for its bot's tokens, while the
    # other project's go at once through the installation's bot.
    shop_posts = [_send(a, "slack", order=f"R-{n}") for n in range(2)]
    other_posts = [_send(b, "slack", order=f"R-{n}") for n in range(2)]
    _sent(*other_posts, *shop_posts)
    assert any(d.startswith("rate_limited:shop-slack") for d in _deferred(shop_posts)), _deferred(shop_posts)
    assert not _deferred(other_posts)

    # The account's own breaker: the shop's Telegram bot fails, its breaker opens, the installation's stays closed
    # and the other project's Telegram messages keep going out; the shop's wait for their own bot.
    telegram_stub.respond(
        502,
        {"ok": False, "error_code": 502, "description": "Bad Gateway"},
        match=lambda request: request.route == f"/bot{SHOP_TELEGRAM_TOKEN}/sendMessage",
    )
    failing = [_send(a, "telegram", order=f"F-{n}") for n in range(3)]
    assert wait_for(lambda: breaker.state("shop-telegram") == breaker.OPEN, 60)
    assert _sent(_send(b, "telegram", order="B-2"))[0].provider == "telegram"
    assert breaker.state("telegram") == breaker.CLOSED
    waiting = Delivery.objects.filter(pk__in=failing)
    assert not waiting.filter(status="sent").exists()
    assert set(waiting.values_list("provider", flat=True)) <= {"shop-telegram", ""}


ACCOUNTS = {
    "shop-ses": {"provider": "ses", "region": "eu-west-1"},
    "shop-sms": {"provider": "twilio", "account_sid": twilio.ACCOUNT_SID, "auth_token": "a-secret-token"},
}


def _project_form(project: Project, **fields: str) -> dict[str, str]:
    """Return the admin change form of `project` as a browser posts it, with `fields` changed."""
    body = {
        "slug": project.slug,
        "name": project.name,
        "promotion": project.promotion,
        "email_from": "",
        "email_reply_to": "",
        "sms_sender": "",
        "default_layout": "",
        "rate_limit": "",
        "weight": "1",
        "email_account": "",
        "sms_account": "",
        "slack_account": "",
        "telegram_account": "",
        "whatsapp_account": "",
        **_inline("environments", 2),
        **_inline("memberships", 0),
    }
    for n, environment in enumerate(project.environments.order_by("pk")):
        body |= {f"environments-{n}-id": str(environment.pk), f"environments-{n}-project": str(project.pk)}
        body[f"environments-{n}-quotas"] = "{}"
    return {**body, **fields}


@pytest.mark.django_db
def test_the_admin_refuses_bad_senders_and_accounts_not_configured_with_form_errors(staff: Any, settings: Any) -> None:
    from django.urls import reverse

    settings.PROVIDER_ACCOUNTS = ACCOUNTS
    shop = project_create(slug="shop")
    url = reverse("admin:projects_project_change", args=[shop.pk])
    page = staff.get(url)
    # The accounts are offered by channel, by name; their settings (the token) never reach the page.
    form = page.context["adminform"].form
    assert [value for value, _ in form.fields["email_account"].choices] == ["", "shop-ses"]
    assert [value for value, _ in form.fields["sms_account"].choices] == ["", "shop-sms"]
    assert b"a-secret-token" not in page.content

    bad = [
        ("email_from", "no-reply@", "Enter an email address"),
        ("email_from", "Shop <no-reply@shop>", "not a valid email address"),
        ("email_from", "Shop <a@shop.example>\r\nBcc: x@evil.example", "one line"),
        ("email_reply_to", "Help help@shop.example", "not a valid email address"),
        ("sms_sender", "+1 (415) call-me", "E.164"),
        ("sms_sender", "SHOP-SENDER-TOO-LONG", "1-11 letters"),
        ("default_layout", "brand layout", "layout key"),
        ("email_account", "shop-sms", "Select a valid choice"),  # an SMS account for email
        ("sms_account", "nowhere", "Select a valid choice"),
    ]
    for field, value, reason in bad:
        answer = staff.post(url, _project_form(shop, **{field: value}))
        assert answer.status_code == 200, field  # the form again, not a redirect
        errors = answer.context["adminform"].form.errors
        assert list(errors) == [field] and reason in " ".join(errors[field]), (field, errors)
    shop.refresh_from_db()
    assert (shop.email_from, shop.sms_sender, shop.provider_accounts) == ("", "", {})

    good = {
        "email_from": SHOP_FROM,
        "email_reply_to": SHOP_REPLY_TO,
        "sms_sender": "SHOP",
        "default_layout": "brand",
        "email_account": "shop-ses",
        "sms_account": "shop-sms",
    }
    answer = staff.post(url, _project_form(shop, **good))
    assert answer.status_code == 302, answer.context and answer.context["adminform"].form.errors
    shop.refresh_from_db()
    assert (shop.email_from, shop.email_reply_to, shop.sms_sender) == (SHOP_FROM, SHOP_REPLY_TO, "SHOP")
    assert shop.provider_accounts == {"email": "shop-ses", "sms": "shop-sms"}

    # An account removed from the environment since: shown as such, and saving says why it cannot stay.
    settings.PROVIDER_ACCOUNTS = {"shop-ses": ACCOUNTS["shop-ses"]}
    page = staff.get(url)
    assert ("shop-sms", "shop-sms (not configured)") in page.context["adminform"].form.fields["sms_account"].choices
    answer = staff.post(url, _project_form(shop, **good))
    errors = answer.context["adminform"].form.errors
    assert list(errors) == ["sms_account"] and "not a sms account of PROVIDER_ACCOUNTS" in errors["sms_account"][0]


CHAT_ACCOUNTS = {
    "shop-slack": {"provider": "slack", "bot_token": "xoxb-a-secret-bot-token"},
    "ops-slack": {"provider": "slack", "bot_token": "xoxb-another-workspace"},
    "shop-telegram": {"provider": "telegram", "bot_token": "42:a-secret-telegram-token"},
    "shop-whatsapp": {
        "provider": "twilio_whatsapp",
        "account_sid": twilio.ACCOUNT_SID,
        "auth_token": "a-secret-token",
        "from_number": "+15005550088",
    },
    **ACCOUNTS,
}


@pytest.mark.django_db
def test_the_admin_offers_chat_accounts_per_network_and_refuses_an_unknown_or_another_networks(
    staff: Any, settings: Any
) -> None:
    from django.urls import reverse

    settings.PROVIDER_ACCOUNTS = CHAT_ACCOUNTS
    shop = project_create(slug="shop")
    url = reverse("admin:projects_project_change", args=[shop.pk])
    page = staff.get(url)
    fields = page.context["adminform"].form.fields
    offered = {channel: [value for value, _ in fields[f"{channel}_account"].choices] for channel in CHAT_NETWORKS}
    assert offered == {
        "slack": ["", "ops-slack", "shop-slack"],
        "telegram": ["", "shop-telegram"],
        "whatsapp": ["", "shop-whatsapp"],
    }
    assert [value for value, _ in fields["sms_account"].choices] == ["", "shop-sms"]  # WhatsApp's is not an SMS one
    for secret in (b"xoxb-a-secret-bot-token", b"a-secret-telegram-token", b"a-secret-token"):
        assert secret not in page.content

    bad = [
        ("slack_account", "nowhere"),  # no such account
        ("slack_account", "shop-telegram"),  # another network's bot
        ("telegram_account", "shop-slack"),
        ("whatsapp_account", "shop-sms"),  # a Twilio account of SMS, not of WhatsApp
        ("sms_account", "shop-whatsapp"),
    ]
    for field, value in bad:
        answer = staff.post(url, _project_form(shop, **{field: value}))
        assert answer.status_code == 200, field  # the form again, not a redirect
        errors = answer.context["adminform"].form.errors
        assert list(errors) == [field] and "Select a valid choice" in " ".join(errors[field]), (field, errors)
    shop.refresh_from_db()
    assert shop.provider_accounts == {}

    chosen = {"slack_account": "shop-slack", "telegram_account": "shop-telegram", "whatsapp_account": "shop-whatsapp"}
    answer = staff.post(url, _project_form(shop, **chosen))
    assert answer.status_code == 302, answer.context and answer.context["adminform"].form.errors
    shop.refresh_from_db()
    assert shop.provider_accounts == {"slack": "shop-slack", "telegram": "shop-telegram", "whatsapp": "shop-whatsapp"}
    # What the send path reads (the cached settings) names the accounts by channel.
    from projects.selectors import sending_settings

    environment = shop.environments.get(name="live")
    assert sending_settings(environment.pk).provider_accounts == {
        "slack": ["shop-slack"], "telegram": ["shop-telegram"], "whatsapp": ["shop-whatsapp"]
    }  # fmt: skip

    # A bot removed from the environment since: shown as such, and saving says why it cannot stay.
    settings.PROVIDER_ACCOUNTS = {k: v for k, v in CHAT_ACCOUNTS.items() if k != "shop-telegram"}
    page = staff.get(url)
    assert ("shop-telegram", "shop-telegram (not configured)") in page.context["adminform"].form.fields[
        "telegram_account"
    ].choices
    answer = staff.post(url, _project_form(shop, **chosen))
    errors = answer.context["adminform"].form.errors
    assert list(errors) == ["telegram_account"], errors
    assert "not a telegram account of PROVIDER_ACCOUNTS" in errors["telegram_account"][0]


CHAT_NETWORKS = ("slack", "telegram", "whatsapp")


@pytest.mark.django_db(transaction=True)
def test_a_projects_settings_cost_a_send_batch_no_query(api_client_factory: Any) -> None:
    """Sender identities and the default layout are read from the per-process cache, not per delivery.

    Project A sets every sending setting and names no layout in its template (its default layout applies); B sets
    none and names the same layout in its template. Their batches, of the same size, make the same queries.
    """
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from channels_app.services import deliver

    shop = project_create(slug="shop")
    project_create(slug="other")
    shop.email_from, shop.email_reply_to, shop.sms_sender, shop.default_layout = (
        SHOP_FROM,
        SHOP_REPLY_TO,
        "SHOP",
        "brand",
    )
    shop.save()
    keys = {"a": api_client_factory(project="shop"), "b": api_client_factory(project="other")}
    for name, (_, api) in keys.items():
        assert (
            api.put("/api/v1/layouts/brand", {"html": "<main>{{ content }}</main>"}, format="json").status_code == 201
        )
        body = {
            "category": "transactional",
            "default_locale": "en",
            "content": CONTENT,
            "layout": "" if name == "a" else "brand",
        }
        assert api.put("/api/v1/templates/shipped", body, format="json").status_code == 201
        for n in range(4):
            person = {"email": f"{name}{n}@example.com"}
            assert api.put(f"/api/v1/recipients/u-{n}", person, format="json").status_code == 201

    def batch(api: Any, users: range) -> list[int]:
        ids = []
        for n in users:
            body = {
                "recipient": {"user_id": f"u-{n}"},
                "template": "shipped",
                "channels": ["email"],
                "payload": {"order": n},
            }
            answer = api.post("/api/v1/notifications", body, format="json")
            assert answer.status_code == 202, answer.content
            ids.append(Delivery.objects.get(notification_id=answer.json()["id"]).pk)
        return ids

    queries = {}
    for name, (_, api) in keys.items():
        assert deliver(batch(api, range(1))).sent == 1  # the caches warm up: the template, the project
        ids = batch(api, range(1, 4))
        with CaptureQueriesContext(connection) as captured:
            assert deliver(ids).sent == 3
        queries[name] = len(captured.captured_queries)
        # The project's settings came from the cache: no statement of the batch read a project.
        assert not [q["sql"] for q in captured.captured_queries if "projects_" in q["sql"]]
        html = [m["content"]["html"] for m in api.get("/api/v1/sandbox/messages").json()["results"]]
        assert len(html) == 4 and all(h.startswith("<main>") or "<main" in h for h in html), html
    assert queries["a"] == queries["b"], queries


@pytest.mark.django_db(transaction=True)
def test_an_account_gone_or_of_another_network_costs_only_its_own_deliveries(
    projects: dict[str, tuple[Any, Any]],
    start_worker: Any,
    slack_stub: SlackStub,
    slack_env: dict[str, str],
    telegram_stub: TelegramStub,
    telegram_env: dict[str, str],
) -> None:
    # Written around the admin (which refuses both): the shop's Slack names a Telegram bot, its Telegram an
    # account no longer configured. The other project's Slack goes through an account of its own.
    telegram_stub.tokens.add(SHOP_TELEGRAM_TOKEN)
    accounts = {
        "shop-telegram": {"provider": "telegram", "bot_token": SHOP_TELEGRAM_TOKEN},
        "other-slack": {"provider": "slack", "bot_token": OTHER_SLACK_TOKEN},
    }
    slack_stub.tokens.add(OTHER_SLACK_TOKEN)
    Project.objects.filter(slug="shop").update(provider_accounts={"slack": "shop-telegram", "telegram": "gone"})
    other = Project.objects.get(slug="other")
    other.provider_accounts = {"slack": "other-slack"}
    other.save()  # through the model: every process's configuration cache drops the projects' settings
    for name, (_, api) in projects.items():
        answer = api.put("/api/v1/recipients/u-1", {"chat": CHAT_ADDRESSES[name]}, format="json")
        assert answer.status_code in (200, 201), answer.content
    (_, a), (_, b) = projects["a"], projects["b"]
    # Queued before any worker runs: each queue's deliveries of both projects are taken as one batch, the
    # shop's first.
    bad_slack, bad_telegram = _send(a, "slack"), _send(a, "telegram")
    good_slack, good_telegram = _send(b, "slack"), _send(b, "telegram")
    env = {
        **slack_env,
        **telegram_env,
        "SLACK_PROVIDERS": "slack",
        "TELEGRAM_PROVIDERS": "telegram",
        "PROVIDER_ACCOUNTS": json.dumps(accounts),
        "DELIVERY_MAX_ATTEMPTS": "2",
        "RETRY_BACKOFF_BASE_SECONDS": "0.5",
    }
    # One process: an account's problem is logged once per process.
    worker = start_worker(queues=["slack.high", "telegram.high", "maintenance"], env=env, concurrency=1)

    slack, telegram = _sent(good_slack, good_telegram)
    assert (slack.provider, slack.attempts, slack.last_error) == ("other-slack", 1, "")
    assert (telegram.provider, telegram.attempts, telegram.last_error) == ("telegram", 1, "")
    assert slack_stub.tokens_by_channel() == {"U0OTHER001": OTHER_SLACK_TOKEN}
    assert telegram_stub.tokens_by_chat() == {"2002": TELEGRAM_TOKEN}  # nothing of the shop's, by no bot

    # The shop's are retried (an operator may fix the setting meanwhile), then failed and dead-lettered.
    def exhausted() -> list[Delivery]:
        found = Delivery.objects.filter(pk__in=[bad_slack, bad_telegram], status="failed").order_by("channel")
        return list(found) if len(found) == 2 else []

    failed_slack, failed_telegram = wait_for(exhausted, 60)
    assert failed_slack.reason == failed_telegram.reason == "attempts_exhausted"
    assert failed_slack.last_error == (
        "[provider_account] provider account 'shop-telegram' is a telegram account (telegram), not a slack one"
    )
    assert failed_telegram.last_error == "[provider_account] provider account 'gone' is not in PROVIDER_ACCOUNTS"
    assert (failed_slack.attempts, failed_telegram.attempts) == (2, 2)
    assert DeadLetter.objects.filter(delivery_id__in=[bad_slack, bad_telegram]).count() == 2
    assert slack_stub.tokens_by_channel() == {"U0OTHER001": OTHER_SLACK_TOKEN}
    assert len(telegram_stub.requests) == 1
    # Said once per account and channel by the worker's send path, whatever the number of attempts; no secret.
    log = worker.log()
    assert log.count("provider account 'shop-telegram' is a telegram account") >= 1
    assert log.count("its slack deliveries are not sent through it") == 1
    assert log.count("its telegram deliveries are not sent through it") == 1
    assert SHOP_TELEGRAM_TOKEN not in log


@pytest.mark.django_db
def test_the_cached_load_of_a_projects_settings_warns_of_an_unusable_account(settings: Any, caplog: Any) -> None:
    from projects.selectors import environment_of, sending_settings

    settings.PROVIDER_ACCOUNTS = {"shop-telegram": {"provider": "telegram", "bot_token": "777:secret"}}
    shop = project_create(slug="shop")
    shop.provider_accounts = {"slack": "shop-telegram", "telegram": ["shop-telegram", "gone"]}
    shop.save()
    with caplog.at_level("WARNING", logger="projects.selectors"):
        loaded = sending_settings(environment_of(project="shop", mode="live").pk)
    assert loaded.provider_accounts == {"slack": ["shop-telegram"], "telegram": ["shop-telegram", "gone"]}
    assert [r.getMessage() for r in caplog.records] == [
        "project 'shop' sends its slack through provider account 'shop-telegram' is a telegram account (telegram),"
        " not a slack one",
        "project 'shop' sends its telegram through provider account 'gone' is not in PROVIDER_ACCOUNTS",
    ]
    assert "777:secret" not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_an_account_that_cannot_be_built_retries_only_its_own_group(
    projects: dict[str, tuple[Any, Any]], settings: Any, slack_stub: SlackStub
) -> None:
    # A worker refuses to start with such an account (channels_app.checks); a process that builds adapters
    # lazily meets it in the middle of a batch, where it must cost only that account's deliveries.
    from channels_app.providers.registry import get_provider
    from channels_app.services import deliver

    settings.PROVIDER_ACCOUNTS = {"shop-slack": {"provider": "slack"}}  # its bot_token left out
    settings.SLACK_BOT_TOKEN, settings.SLACK_BASE_URL = SLACK_TOKEN, f"{slack_stub.url}/api/"
    settings.CHANNEL_PROVIDERS = {**settings.CHANNEL_PROVIDERS, "slack": ["slack"]}
    shop = Project.objects.get(slug="shop")
    shop.provider_accounts = {"slack": "shop-slack"}
    shop.save()
    for name, (_, api) in projects.items():
        assert api.put("/api/v1/recipients/u-1", {"chat": CHAT_ADDRESSES[name]}, format="json").status_code == 200
    (_, a), (_, b) = projects["a"], projects["b"]
    shops, others = _send(a, "slack"), _send(b, "slack")  # the shop's group comes first in the batch
    get_provider.cache_clear()
    try:
        report = deliver([shops, others])
    finally:
        get_provider.cache_clear()
    assert (report.sent, report.retried) == (1, 1)
    other, mine = Delivery.objects.get(pk=others), Delivery.objects.get(pk=shops)
    assert (other.status, other.provider) == ("sent", "slack")
    assert (mine.status, mine.reason) == ("queued", "retry")
    assert mine.last_error == "[provider_config] PROVIDER_ACCOUNTS: account 'shop-slack': bot_token is not set"
    assert slack_stub.tokens_by_channel() == {"U0OTHER001": SLACK_TOKEN}
