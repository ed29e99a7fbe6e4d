"""SmtpProvider: Django's SMTP backend against an aiosmtpd capture server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from channels_app.providers.base import ConfigurationError, OutboundMessage, PermanentError, RetriableError
from channels_app.providers.smtp import SmtpProvider
from tests.stubs.config import configure_settings
from tests.stubs.smtp import SmtpStub, free_port

pytestmark = pytest.mark.pure

pytest_plugins = ["tests.stubs.fixtures"]

TO = "bob@example.test"


def email(to: str = TO, meta: dict[str, Any] | None = None, html: bool = True) -> OutboundMessage:
    content = {"subject": "Welcome", "text": "Hello Bob"}
    if html:
        content["html"] = "<p>Hello <b>Bob</b></p>"
    return OutboundMessage(
        delivery_id=21, channel="email", address=to, content=content, idempotency_key="d-21", meta=meta or {}
    )


@pytest.fixture
def provider(settings: Any, smtp_env: dict[str, str]) -> Iterator[SmtpProvider]:
    """The provider built from settings, pointed at the capture server."""
    configure_settings(settings, smtp_env)
    instance = SmtpProvider.from_settings()
    yield instance
    instance.close()


def test_success_sends_text_and_html_parts(provider: SmtpProvider, smtp_stub: SmtpStub) -> None:
    result = provider.send(email())
    (mail,) = smtp_stub.messages
    assert mail.rcpt_tos == [TO] and mail.mail_from == "no-reply@notifier.test"
    message = mail.message
    assert message["Subject"] == "Welcome"
    assert message["From"] == "Notifier <no-reply@notifier.test>"
    assert message["Message-ID"] == result.provider_message_id
    assert result.provider_message_id.endswith("@notifier.test>")
    assert message.get_content_type() == "multipart/alternative"
    assert message.get_body(("plain",)).get_content().strip() == "Hello Bob"
    assert message.get_body(("html",)).get_content().strip() == "<p>Hello <b>Bob</b></p>"
    assert message["List-Unsubscribe"] is None


def test_list_unsubscribe_headers(provider: SmtpProvider, smtp_stub: SmtpStub) -> None:
    provider.send(email(meta={"list_unsubscribe": "https://notifier.example/u/xyz"}))
    message = smtp_stub.messages[0].message
    assert message["List-Unsubscribe"] == "<https://notifier.example/u/xyz>"
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"


def test_text_only(provider: SmtpProvider, smtp_stub: SmtpStub) -> None:
    provider.send(email(html=False))
    assert smtp_stub.messages[0].message.get_content_type() == "text/plain"


def test_connection_is_reused(provider: SmtpProvider, smtp_stub: SmtpStub) -> None:
    provider.send(email())
    first = provider._pool.queue[-1].backend.connection
    provider.send(email())
    provider.send(email())
    assert provider._pool.queue[-1].backend.connection is first
    assert len(smtp_stub.messages) == 3


def test_idle_connection_dropped_by_server_is_reopened(
    settings: Any, smtp_env: dict[str, str], smtp_stub: SmtpStub
) -> None:
    configure_settings(settings, {**smtp_env, "SMTP_IDLE_CHECK_SECONDS": "0", "SMTP_POOL_SIZE": "1"})
    provider = SmtpProvider.from_settings()
    try:
        provider.send(email())
        # The server side goes away (restart, idle timeout) while the connection sits in the pool.
        provider._pool.queue[0].backend.connection.sock.close()
        provider.send(email())
    finally:
        provider.close()
    assert len(smtp_stub.messages) == 2


@pytest.mark.parametrize("code", [550, 551, 553])
def test_recipient_hard_bounce_is_permanent_and_suppressed(
    provider: SmtpProvider, smtp_stub: SmtpStub, code: int
) -> None:
    smtp_stub.rcpt_replies[TO] = f"{code} 5.1.1 <{TO}>: Recipient address rejected: User unknown"
    with pytest.raises(PermanentError) as info:
        provider.send(email())
    assert info.value.suppress is True and info.value.code == f"smtp_{code}"
    assert TO not in str(info.value) and "5.1.1" in str(info.value)


def test_other_5xx_recipient_reply_is_permanent_without_suppression(
    provider: SmtpProvider, smtp_stub: SmtpStub
) -> None:
    smtp_stub.rcpt_replies[TO] = "554 5.7.1 Relay access denied"
    with pytest.raises(PermanentError) as info:
        provider.send(email())
    assert info.value.suppress is False


def test_recipient_4xx_is_retriable(provider: SmtpProvider, smtp_stub: SmtpStub) -> None:
    smtp_stub.rcpt_replies[TO] = "451 4.7.1 Greylisted, try again later"
    with pytest.raises(RetriableError) as info:
        provider.send(email())
    assert info.value.code == "smtp_451"
    # The connection survives a refused recipient: the next message goes through.
    smtp_stub.rcpt_replies.clear()
    provider.send(email())
    assert len(smtp_stub.messages) == 1


def test_data_5xx_is_permanent(provider: SmtpProvider, smtp_stub: SmtpStub) -> None:
    smtp_stub.data_reply = "554 5.6.0 Message content rejected"
    with pytest.raises(PermanentError) as info:
        provider.send(email())
    assert info.value.suppress is False and info.value.code == "smtp_554"


def test_data_4xx_is_retriable(provider: SmtpProvider, smtp_stub: SmtpStub) -> None:
    smtp_stub.data_reply = "452 4.3.1 Insufficient system storage"
    with pytest.raises(RetriableError):
        provider.send(email())


def test_rate_limit_reply_is_retriable(provider: SmtpProvider, smtp_stub: SmtpStub) -> None:
    smtp_stub.data_reply = "421 4.7.0 Too many messages, slow down"
    with pytest.raises(RetriableError):
        provider.send(email())


def test_connection_refused_is_retriable_not_sent(settings: Any, smtp_env: dict[str, str]) -> None:
    configure_settings(settings, {**smtp_env, "SMTP_PORT": str(free_port())})
    provider = SmtpProvider.from_settings()
    with pytest.raises(RetriableError) as info:
        provider.send(email())
    assert info.value.code == "connection_error" and info.value.maybe_sent is False


def test_timeout_during_data_is_maybe_sent(settings: Any, smtp_env: dict[str, str], smtp_stub: SmtpStub) -> None:
    configure_settings(settings, {**smtp_env, "SMTP_TIMEOUT_SECONDS": "0.5"})
    smtp_stub.data_delay = 3
    provider = SmtpProvider.from_settings()
    try:
        with pytest.raises(RetriableError) as info:
            provider.send(email())
    finally:
        provider.close()
    assert info.value.maybe_sent is True


def test_batch_uses_the_connection_pool(provider: SmtpProvider, smtp_stub: SmtpStub) -> None:
    smtp_stub.rcpt_replies["gone@example.test"] = "550 5.1.1 User unknown"
    messages = [email(f"user{i}@example.test") for i in range(8)] + [email("gone@example.test")]
    outcomes = provider.send_batch(messages)
    assert [type(o).__name__ for o in outcomes] == ["SendResult"] * 8 + ["PermanentError"]
    assert sorted(m.rcpt_tos[0] for m in smtp_stub.messages) == sorted(f"user{i}@example.test" for i in range(8))


@pytest.mark.parametrize(("missing", "variable"), [("SMTP_HOST", "SMTP_HOST"), ("EMAIL_FROM", "EMAIL_FROM")])
def test_from_settings_names_the_missing_variable(
    settings: Any, smtp_env: dict[str, str], missing: str, variable: str
) -> None:
    configure_settings(settings, {**smtp_env, missing: ""})
    with pytest.raises(ConfigurationError, match=variable):
        SmtpProvider.from_settings()


def test_tls_and_ssl_are_exclusive(settings: Any, smtp_env: dict[str, str]) -> None:
    configure_settings(settings, {**smtp_env, "SMTP_USE_TLS": "true", "SMTP_USE_SSL": "true"})
    with pytest.raises(ConfigurationError, match="SMTP_USE_TLS"):
        SmtpProvider.from_settings()
