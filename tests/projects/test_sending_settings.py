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
from notifier.deliveries.models import Delivery
from projects.models import Project
from projects.services import project_create
from tests.conftest import wait_for
from tests.stubs import aws, twilio
from tests.stubs.config import EMAIL_FROM, SMS_FROM
from tests.stubs.smtp import SmtpStub
from tests.stubs.twilio import TwilioStub

CONTENT = {
    "en": {
        "email": {"subject": "Order {{ order }}", "text": "Shipped {{ order }}", "html": "<p>Shipped {{ order }}</p>"},
        "sms": {"text": "Order {{ order }} shipped"},
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
