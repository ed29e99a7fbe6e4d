"""Real provider SDKs through real workers: the pipeline, failover and suppression against local stand-ins."""

from __future__ import annotations

from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from notifier.accepting.services import notification_accept
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from preferences.models import Recipient, Suppression
from preferences.services import recipient_upsert
from templates_app.services import template_put
from tests.conftest import wait_for
from tests.stubs.config import WEBHOOK_SECRET

CONTENT = {
    "en": {
        "email": {"subject": "Sale {{ pct }}%", "text": "Everything -{{ pct }}%", "html": "<p>-{{ pct }}%</p>"},
        "sms": {"text": "Your code is {{ code }}"},
        "webhook": {"body": {"event": "order.shipped", "order": "{{ order }}"}},
    }
}


def _client() -> ApiClient:
    template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    template_put(key="m", category="marketing", default_locale="en", content=CONTENT)
    return api_client_create(name="e2e")[0]


def _send(client: ApiClient, user_id: str, channel: str, template: str = "t", **payload: Any) -> Delivery:
    category = "marketing" if template == "m" else "transactional"
    result = notification_accept(
        client=client,
        data={
            "recipient": {"user_id": user_id},
            "category": category,
            "template": template,
            "channels": [channel],
            "payload": {"code": "1234", "order": "A-1", "pct": 20, **payload},
        },
    )
    return result.deliveries[0]


@pytest.mark.django_db(transaction=True)
def test_sms_fails_over_from_twilio_to_sns_and_records_it(
    start_worker: Any, twilio_stub: Any, twilio_env: dict[str, str], aws_stub: Any, aws_env: dict[str, str]
) -> None:
    client = _client()
    recipient_upsert(user_id="u-1", phone="+14155550101")
    twilio_stub.fail(503, 20500, times=1)
    start_worker(env={**twilio_env, **aws_env, "SMS_PROVIDERS": "twilio,sns", "RETRY_BACKOFF_BASE_SECONDS": "0.5"})
    delivery = _send(client, "u-1", "sms")
    sent = wait_for(lambda: Delivery.objects.filter(pk=delivery.pk, status="sent").first(), 60)
    assert sent.provider == "sns"
    assert sent.provider_message_id
    details = list(sent.events.values_list("status", "detail"))
    assert ("failover", "twilio -> sns") in details
    assert len(twilio_stub.messages()) == 1
    assert [p["PhoneNumber"] for p in aws_stub.sns_publishes()] == ["+14155550101"]


@pytest.mark.django_db(transaction=True)
def test_twilio_stop_reply_fails_and_suppresses_the_number(
    start_worker: Any, twilio_stub: Any, twilio_env: dict[str, str]
) -> None:
    client = _client()
    recipient_upsert(user_id="u-2", phone="+14155550102")
    twilio_stub.fail(400, 21610)
    start_worker(env={**twilio_env, "SMS_PROVIDERS": "twilio"})
    delivery = _send(client, "u-2", "sms")
    failed = wait_for(lambda: Delivery.objects.filter(pk=delivery.pk, status="failed").first(), 30)
    assert failed.attempts == 1
    assert Suppression.objects.filter(channel="sms", address="+14155550102").exists()
    # The next notification to that number is suppressed at accept, before any provider call.
    again = _send(client, "u-2", "sms")
    assert (again.status, again.reason) == ("suppressed", "suppressed")


@pytest.mark.django_db(transaction=True)
def test_signed_webhook_reaches_the_receiver(
    start_worker: Any, webhook_receiver: Any, webhook_env: dict[str, str]
) -> None:
    client = _client()
    recipient_upsert(user_id="u-3", webhook_url=f"{webhook_receiver.url}/hooks")
    start_worker(env={**webhook_env, "WEBHOOK_PROVIDERS": "webhook"})
    delivery = _send(client, "u-3", "webhook")
    wait_for(lambda: Delivery.objects.filter(pk=delivery.pk, status="sent").exists(), 30)
    [request] = webhook_receiver.requests
    headers = {k.lower(): v for k, v in request.headers.items()}
    payload = Webhook(WEBHOOK_SECRET).verify(request.body, headers)
    assert payload == {"event": "order.shipped", "order": "A-1"}
    assert headers["webhook-id"] == f"dlv_{delivery.pk}"


@pytest.mark.django_db(transaction=True)
def test_marketing_email_over_smtp_carries_one_click_unsubscribe(
    start_worker: Any, smtp_stub: Any, smtp_env: dict[str, str]
) -> None:
    client = _client()
    recipient_upsert(user_id="u-4", email="u4@example.com")
    start_worker(env={**smtp_env, "EMAIL_PROVIDERS": "smtp"})
    delivery = _send(client, "u-4", "email", template="m")
    wait_for(lambda: Delivery.objects.filter(pk=delivery.pk, status="sent").exists(), 30)
    [mail] = smtp_stub.messages
    message = mail.message
    assert mail.rcpt_tos == ["u4@example.com"]
    assert message["Subject"] == "Sale 20%"
    assert "/unsubscribe/" in message["List-Unsubscribe"]
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    # The link works: one click switches marketing off for this recipient.
    from django.test import Client

    url = message["List-Unsubscribe"].strip("<>").split("/unsubscribe/", 1)[1]
    assert Client().post(f"/unsubscribe/{url}").status_code == 200
    prefs = Recipient.objects.get(user_id="u-4").category_prefs
    assert prefs["marketing"]["enabled"] is False
