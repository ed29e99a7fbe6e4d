"""Pytest fixtures for the provider stand-ins; load with `pytest_plugins = ["tests.stubs.fixtures"]`.

Each `*_stub` fixture starts a fresh stand-in for one test (moto's server is shared by the session and
reset per test). Each `*_env` fixture returns the environment variables that point the real adapter at
that stand-in: apply them to Django settings in-process with `configure_settings`, or pass them as the
`env` of `start_worker` so a worker subprocess uses the stand-in.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stubs import aws, fcm, twilio
from tests.stubs.aws import AwsFaultProxy, MotoServer
from tests.stubs.chat import SLACK_TOKEN, TELEGRAM_TOKEN, ChatWebhookStub, SlackStub, TelegramStub
from tests.stubs.config import EMAIL_FROM, SMS_FROM, WEBHOOK_SECRET
from tests.stubs.fcm import FcmStub
from tests.stubs.smtp import SmtpStub
from tests.stubs.twilio import TwilioStub
from tests.stubs.webhook import TimedReceiver, WebhookReceiver


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    """A webhook receiver on 127.0.0.1."""
    with WebhookReceiver() as server:
        yield server


@pytest.fixture
def receiver() -> Iterator[TimedReceiver]:
    """A webhook receiver on 127.0.0.1 that timestamps each request and records which delivery it carried."""
    with TimedReceiver() as server:
        yield server


@pytest.fixture
def webhook_env() -> dict[str, str]:
    """Environment for webhook delivery to loopback stand-ins."""
    return {"WEBHOOK_SIGNING_SECRET": WEBHOOK_SECRET, "WEBHOOK_ALLOW_PRIVATE_TARGETS": "true"}


@pytest.fixture
def fcm_stub() -> Iterator[FcmStub]:
    """An FCM HTTP v1 + OAuth token stand-in."""
    with FcmStub() as server:
        yield server


@pytest.fixture
def fcm_env(fcm_stub: FcmStub, tmp_path: Path) -> dict[str, str]:
    """Environment pointing FcmProvider at the stand-in, with a freshly generated service account."""
    path = fcm.write_service_account(tmp_path / "fcm-service-account.json", token_uri=fcm_stub.token_uri)
    return {
        "FCM_CREDENTIALS_FILE": str(path),
        "FCM_ENDPOINT": fcm_stub.url,
        "FCM_TOKEN_URI": fcm_stub.token_uri,
        "FCM_TIMEOUT_SECONDS": "2",
    }


@pytest.fixture
def twilio_stub() -> Iterator[TwilioStub]:
    """A Twilio Messages API stand-in."""
    with TwilioStub() as server:
        yield server


@pytest.fixture
def twilio_env(twilio_stub: TwilioStub) -> dict[str, str]:
    """Environment pointing TwilioProvider at the stand-in."""
    return {
        "TWILIO_ACCOUNT_SID": twilio.ACCOUNT_SID,
        "TWILIO_AUTH_TOKEN": twilio.AUTH_TOKEN,
        "TWILIO_FROM_NUMBER": SMS_FROM,
        "TWILIO_BASE_URL": twilio_stub.url,
        "TWILIO_TIMEOUT_SECONDS": "2",
    }


@pytest.fixture
def smtp_stub() -> Iterator[SmtpStub]:
    """An aiosmtpd capture server."""
    server = SmtpStub().start()
    yield server
    server.stop()


@pytest.fixture
def smtp_env(smtp_stub: SmtpStub) -> dict[str, str]:
    """Environment pointing SmtpProvider at the capture server."""
    return {
        "SMTP_HOST": smtp_stub.host,
        "SMTP_PORT": str(smtp_stub.port),
        "SMTP_TIMEOUT_SECONDS": "2",
        "EMAIL_FROM": EMAIL_FROM,
    }


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """moto's server, shared by the session."""
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def aws_stub(moto_server: MotoServer) -> Iterator[AwsFaultProxy]:
    """A fault proxy in front of a freshly reset moto (SES v2 and SNS)."""
    moto_server.reset()
    with AwsFaultProxy(moto_server.url) as proxy:
        yield proxy


@pytest.fixture
def aws_env(aws_stub: AwsFaultProxy) -> dict[str, str]:
    """Environment pointing SesProvider and SnsProvider at the fault proxy."""
    return {
        "AWS_REGION": aws.REGION,
        "AWS_ACCESS_KEY_ID": aws.ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": aws.SECRET_KEY,
        "SES_ENDPOINT_URL": aws_stub.url,
        "SNS_ENDPOINT_URL": aws_stub.url,
        "AWS_READ_TIMEOUT_SECONDS": "5",
        "EMAIL_FROM": EMAIL_FROM,
    }


@pytest.fixture
def slack_stub() -> Iterator[SlackStub]:
    """A Slack Web API stand-in."""
    with SlackStub() as server:
        yield server


@pytest.fixture
def slack_env(slack_stub: SlackStub) -> dict[str, str]:
    """Environment pointing SlackProvider (the real slack_sdk) at the stand-in."""
    return {"SLACK_BOT_TOKEN": SLACK_TOKEN, "SLACK_BASE_URL": f"{slack_stub.url}/api/", "SLACK_TIMEOUT_SECONDS": "2"}


@pytest.fixture
def telegram_stub() -> Iterator[TelegramStub]:
    """A Telegram Bot API stand-in."""
    with TelegramStub() as server:
        yield server


@pytest.fixture
def telegram_env(telegram_stub: TelegramStub) -> dict[str, str]:
    """Environment pointing TelegramProvider at the stand-in."""
    return {"TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN, "TELEGRAM_BASE_URL": telegram_stub.url}


@pytest.fixture
def chat_webhooks() -> Iterator[ChatWebhookStub]:
    """Teams and Discord incoming-webhook stand-ins on one loopback server."""
    with ChatWebhookStub() as server:
        yield server


@pytest.fixture
def whatsapp_env(twilio_env: dict[str, str]) -> dict[str, str]:
    """Environment pointing the WhatsApp provider at the Twilio stand-in, with a WhatsApp sender."""
    return {**twilio_env, "TWILIO_WHATSAPP_FROM": "+14155238886"}
