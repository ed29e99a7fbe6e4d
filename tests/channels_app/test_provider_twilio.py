"""TwilioProvider: the real twilio SDK against a local Messages API stand-in."""

from __future__ import annotations

from typing import Any

import pytest

from channels_app.providers.base import ConfigurationError, OutboundMessage, PermanentError, RetriableError
from channels_app.providers.twilio_sms import TwilioProvider
from tests.stubs.config import SMS_FROM, configure_settings
from tests.stubs.twilio import TwilioStub

pytest_plugins = ["tests.stubs.fixtures"]

TO = "+15551230001"


def sms(to: str = TO, text: str = "Your code is 123456") -> OutboundMessage:
    return OutboundMessage(delivery_id=7, channel="sms", address=to, content={"text": text}, idempotency_key="d-7")


@pytest.fixture
def provider(settings: Any, twilio_env: dict[str, str]) -> TwilioProvider:
    """The provider built from settings, pointed at the stand-in."""
    configure_settings(settings, twilio_env)
    return TwilioProvider.from_settings()


def test_success_returns_the_message_sid(provider: TwilioProvider, twilio_stub: TwilioStub) -> None:
    result = provider.send(sms())
    assert result.provider_message_id.startswith("SM")
    (form,) = twilio_stub.messages()
    assert form == {"To": TO, "From": SMS_FROM, "Body": "Your code is 123456"}


def test_messaging_service_and_status_callback(
    settings: Any, twilio_env: dict[str, str], twilio_stub: TwilioStub
) -> None:
    configure_settings(
        settings,
        {
            **twilio_env,
            "TWILIO_FROM_NUMBER": "",
            "TWILIO_MESSAGING_SERVICE_SID": "MG" + "1" * 32,
            "TWILIO_STATUS_CALLBACK_URL": "https://notifier.example/callbacks/twilio",
        },
    )
    TwilioProvider.from_settings().send(sms())
    (form,) = twilio_stub.messages()
    assert form["MessagingServiceSid"] == "MG" + "1" * 32 and "From" not in form
    assert form["StatusCallback"] == "https://notifier.example/callbacks/twilio"


def test_connections_are_reused(provider: TwilioProvider, twilio_stub: TwilioStub) -> None:
    for _ in range(3):
        provider.send(sms())
    pools = provider.http.session.get_adapter(twilio_stub.url).poolmanager.pools
    assert len(pools) == 1
    assert next(iter(pools._container.values())).num_connections == 1


@pytest.mark.parametrize(
    ("status", "code", "suppress"),
    [
        (400, 21211, True),  # invalid To
        (400, 21610, True),  # STOP
        (400, 21614, True),  # not a mobile number
        (400, 21408, False),  # region not enabled
        (400, 21602, False),  # body required
        (400, 30007, False),  # carrier filtered
        (400, 99999, False),  # unknown 4xx code
    ],
)
def test_permanent_errors(
    provider: TwilioProvider, twilio_stub: TwilioStub, status: int, code: int, suppress: bool
) -> None:
    twilio_stub.fail(status, code)
    with pytest.raises(PermanentError) as info:
        provider.send(sms())
    assert info.value.code == str(code) and info.value.suppress is suppress
    assert TO not in str(info.value)


def test_429_is_throttled_with_retry_after(provider: TwilioProvider, twilio_stub: TwilioStub) -> None:
    twilio_stub.fail(429, 20429, retry_after="9")
    with pytest.raises(RetriableError) as info:
        provider.send(sms())
    assert info.value.throttled is True and info.value.retry_after == 9 and info.value.code == "20429"


@pytest.mark.parametrize(("status", "code"), [(500, 20500), (503, 20503), (502, 0)])
def test_5xx_is_retriable(provider: TwilioProvider, twilio_stub: TwilioStub, status: int, code: int) -> None:
    twilio_stub.fail(status, code)
    with pytest.raises(RetriableError) as info:
        provider.send(sms())
    assert info.value.throttled is False


def test_wrong_credentials_are_retriable(settings: Any, twilio_env: dict[str, str], twilio_stub: TwilioStub) -> None:
    configure_settings(settings, {**twilio_env, "TWILIO_AUTH_TOKEN": "wrong"})
    with pytest.raises(RetriableError) as info:
        TwilioProvider.from_settings().send(sms())
    assert info.value.code == "20003"


def test_read_timeout_is_maybe_sent(settings: Any, twilio_env: dict[str, str], twilio_stub: TwilioStub) -> None:
    configure_settings(settings, {**twilio_env, "TWILIO_TIMEOUT_SECONDS": "0.5"})
    twilio_stub.hang(5)
    with pytest.raises(RetriableError) as info:
        TwilioProvider.from_settings().send(sms())
    assert info.value.maybe_sent is True


def test_batch_has_per_message_outcomes(provider: TwilioProvider, twilio_stub: TwilioStub) -> None:
    twilio_stub.fail(400, 21610, to="+15551230003")
    twilio_stub.fail(429, 20429, to="+15551230004", retry_after="3")
    outcomes = provider.send_batch([sms(f"+1555123000{i}") for i in range(1, 7)])
    kinds = [type(o).__name__ for o in outcomes]
    assert kinds == ["SendResult", "SendResult", "PermanentError", "RetriableError", "SendResult", "SendResult"]
    assert outcomes[2].suppress is True
    # Retry-After is read from the answer to that very call, not another thread's.
    assert outcomes[3].retry_after == 3 and outcomes[3].throttled


@pytest.mark.parametrize(
    ("missing", "variable"),
    [
        ("TWILIO_ACCOUNT_SID", "TWILIO_ACCOUNT_SID"),
        ("TWILIO_AUTH_TOKEN", "TWILIO_AUTH_TOKEN"),
        ("TWILIO_FROM_NUMBER", "TWILIO_FROM_NUMBER"),
    ],
)
def test_from_settings_names_the_missing_variable(
    settings: Any, twilio_env: dict[str, str], missing: str, variable: str
) -> None:
    configure_settings(settings, {**twilio_env, missing: ""})
    with pytest.raises(ConfigurationError, match=variable):
        TwilioProvider.from_settings()
