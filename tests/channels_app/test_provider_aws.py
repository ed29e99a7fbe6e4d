"""SesProvider and SnsProvider: real boto3 against moto's server behind a programmable fault proxy."""

from __future__ import annotations

from typing import Any

import pytest

from channels_app.providers.base import ConfigurationError, OutboundMessage, PermanentError, RetriableError
from channels_app.providers.ses import SesProvider, aws_client_from_settings
from channels_app.providers.sns_sms import SnsProvider
from tests.stubs.aws import AwsFaultProxy
from tests.stubs.config import configure_settings

pytest_plugins = ["tests.stubs.fixtures"]

TO = "alice@example.test"
PHONE = "+15551230001"


def email(meta: dict[str, Any] | None = None) -> OutboundMessage:
    return OutboundMessage(
        delivery_id=11,
        channel="email",
        address=TO,
        content={"subject": "Your order shipped", "text": "Plain body", "html": "<p>HTML body</p>"},
        idempotency_key="d-11",
        meta=meta or {},
    )


def sms(to: str = PHONE, category: str = "transactional") -> OutboundMessage:
    return OutboundMessage(
        delivery_id=12,
        channel="sms",
        address=to,
        content={"text": "Code 123456"},
        idempotency_key="d-12",
        category=category,
    )


@pytest.fixture
def ses(settings: Any, aws_env: dict[str, str]) -> SesProvider:
    """An SES provider whose sender identity is verified in moto."""
    configure_settings(settings, aws_env)
    provider = SesProvider.from_settings()
    provider.client.create_email_identity(EmailIdentity="no-reply@notifier.test")
    return provider


@pytest.fixture
def sns(settings: Any, aws_env: dict[str, str]) -> SnsProvider:
    """An SNS provider pointed at the proxy."""
    configure_settings(settings, aws_env)
    return SnsProvider.from_settings()


# --- SES ----------------------------------------------------------------------------------------------


def test_ses_success_sends_subject_text_and_html(ses: SesProvider, aws_stub: AwsFaultProxy) -> None:
    result = ses.send(email())
    assert result.provider_message_id
    (request,) = aws_stub.ses_sends()
    body = request.json()
    assert body["FromEmailAddress"] == "Notifier <no-reply@notifier.test>"
    assert body["Destination"] == {"ToAddresses": [TO]}
    simple = body["Content"]["Simple"]
    assert simple["Subject"]["Data"] == "Your order shipped"
    assert simple["Body"]["Text"]["Data"] == "Plain body" and simple["Body"]["Html"]["Data"] == "<p>HTML body</p>"
    assert "Headers" not in simple
    assert body["EmailTags"] == [{"Name": "delivery_id", "Value": "11"}]
    # moto counted it as sent (its SES v1 and v2 share one backend).
    v1 = aws_client_from_settings("ses", region="us-east-1", endpoint_url=aws_stub.url)
    assert v1.get_send_quota()["SentLast24Hours"] == 1


def test_ses_list_unsubscribe_headers(ses: SesProvider, aws_stub: AwsFaultProxy) -> None:
    ses.send(email({"list_unsubscribe": "https://notifier.example/u/abc"}))
    headers = aws_stub.ses_sends()[0].json()["Content"]["Simple"]["Headers"]
    assert {"Name": "List-Unsubscribe", "Value": "<https://notifier.example/u/abc>"} in headers
    assert {"Name": "List-Unsubscribe-Post", "Value": "List-Unsubscribe=One-Click"} in headers


def test_ses_unverified_sender_is_message_rejected(ses: SesProvider, aws_stub: AwsFaultProxy) -> None:
    # moto's own answer, not a programmed one: the sender identity is not verified.
    with pytest.raises(PermanentError) as info:
        ses.send(email({"from_email": "someone@unverified.test"}))
    assert info.value.code == "MessageRejected" and info.value.suppress is False
    assert TO not in str(info.value)


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "MessageRejected"),
        (400, "MailFromDomainNotVerifiedException"),
        (400, "AccountSuspendedException"),
        (400, "SendingPausedException"),
        (400, "BadRequestException"),
        (404, "NotFoundException"),
    ],
)
def test_ses_permanent_errors(ses: SesProvider, aws_stub: AwsFaultProxy, status: int, error_type: str) -> None:
    aws_stub.ses_error(status, error_type)
    with pytest.raises(PermanentError) as info:
        ses.send(email())
    assert info.value.code == error_type.removesuffix("Exception")


@pytest.mark.parametrize(("status", "error_type"), [(429, "TooManyRequestsException"), (400, "Throttling")])
def test_ses_throttling_is_retriable_and_throttled(
    ses: SesProvider, aws_stub: AwsFaultProxy, status: int, error_type: str
) -> None:
    aws_stub.ses_error(status, error_type, retry_after="6")
    with pytest.raises(RetriableError) as info:
        ses.send(email())
    assert info.value.throttled is True and info.value.retry_after == 6
    assert len(aws_stub.ses_sends()) == 1  # botocore's own retries are off


@pytest.mark.parametrize(("status", "error_type"), [(500, "InternalFailure"), (503, "ServiceUnavailable")])
def test_ses_5xx_is_retriable(ses: SesProvider, aws_stub: AwsFaultProxy, status: int, error_type: str) -> None:
    aws_stub.ses_error(status, error_type)
    with pytest.raises(RetriableError) as info:
        ses.send(email())
    assert info.value.throttled is False
    assert len(aws_stub.ses_sends()) == 1


def test_ses_read_timeout_is_maybe_sent(settings: Any, aws_env: dict[str, str], aws_stub: AwsFaultProxy) -> None:
    configure_settings(settings, {**aws_env, "AWS_READ_TIMEOUT_SECONDS": "0.5"})
    aws_stub.hang(10, match=aws_stub.is_ses_send)
    with pytest.raises(RetriableError) as info:
        SesProvider.from_settings().send(email())
    assert info.value.maybe_sent is True and info.value.code == "read_timeout"


def test_ses_unreachable_endpoint_is_retriable(settings: Any, aws_env: dict[str, str]) -> None:
    from tests.stubs.smtp import free_port

    configure_settings(settings, {**aws_env, "SES_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"})
    with pytest.raises(RetriableError) as info:
        SesProvider.from_settings().send(email())
    assert info.value.maybe_sent is False and info.value.code == "connection_error"


def test_ses_batch_runs_concurrently(ses: SesProvider, aws_stub: AwsFaultProxy) -> None:
    aws_stub.ses_error(429, "TooManyRequestsException", times=1)
    outcomes = ses.send_batch([email() for _ in range(6)])
    assert sum(isinstance(o, RetriableError) for o in outcomes) == 1
    assert len(aws_stub.ses_sends()) == 6


def test_ses_from_settings_requires_email_from(settings: Any, aws_env: dict[str, str]) -> None:
    configure_settings(settings, {**aws_env, "EMAIL_FROM": ""})
    with pytest.raises(ConfigurationError, match="EMAIL_FROM"):
        SesProvider.from_settings()


# --- SNS ----------------------------------------------------------------------------------------------


def test_sns_success_publishes_to_the_number(sns: SnsProvider, aws_stub: AwsFaultProxy) -> None:
    result = sns.send(sms())
    assert result.provider_message_id
    (form,) = aws_stub.sns_publishes()
    assert form["PhoneNumber"] == PHONE and form["Message"] == "Code 123456"
    assert form["MessageAttributes.entry.1.Name"] == "AWS.SNS.SMS.SMSType"
    assert form["MessageAttributes.entry.1.Value.StringValue"] == "Transactional"


def test_sns_marketing_is_promotional(sns: SnsProvider, aws_stub: AwsFaultProxy) -> None:
    sns.send(sms(category="marketing"))
    assert aws_stub.sns_publishes()[0]["MessageAttributes.entry.1.Value.StringValue"] == "Promotional"


def test_sns_malformed_number_is_permanent_and_suppressed(sns: SnsProvider, aws_stub: AwsFaultProxy) -> None:
    # moto's own validation of E.164.
    with pytest.raises(PermanentError) as info:
        sns.send(sms(to="+1-not-a-number"))
    assert info.value.code == "InvalidParameter" and info.value.suppress is True


def test_sns_opted_out_is_permanent_and_suppressed(sns: SnsProvider, aws_stub: AwsFaultProxy) -> None:
    aws_stub.sns_error(400, "OptedOut", "Phone number is opted out", phone=PHONE)
    with pytest.raises(PermanentError) as info:
        sns.send(sms())
    assert info.value.suppress is True and info.value.code == "OptedOut"


def test_sns_other_invalid_parameter_is_permanent_without_suppression(
    sns: SnsProvider, aws_stub: AwsFaultProxy
) -> None:
    aws_stub.sns_error(400, "InvalidParameter", "Invalid parameter: Message too long")
    with pytest.raises(PermanentError) as info:
        sns.send(sms())
    assert info.value.suppress is False


@pytest.mark.parametrize("code", ["Throttling", "Throttled"])
def test_sns_throttling_is_retriable(sns: SnsProvider, aws_stub: AwsFaultProxy, code: str) -> None:
    aws_stub.sns_error(400, code, "Rate exceeded")
    with pytest.raises(RetriableError) as info:
        sns.send(sms())
    assert info.value.throttled is True
    assert len(aws_stub.sns_publishes()) == 1


def test_sns_5xx_is_retriable(sns: SnsProvider, aws_stub: AwsFaultProxy) -> None:
    aws_stub.sns_error(500, "InternalError", "oops")
    with pytest.raises(RetriableError) as info:
        sns.send(sms())
    assert info.value.throttled is False


def test_sns_from_settings_checks_the_sms_type(settings: Any, aws_env: dict[str, str]) -> None:
    configure_settings(settings, {**aws_env, "SNS_SMS_TYPE": "Urgent"})
    with pytest.raises(ConfigurationError, match="SNS_SMS_TYPE"):
        SnsProvider.from_settings()


def test_clients_share_one_pool_per_process(settings: Any, aws_env: dict[str, str]) -> None:
    configure_settings(settings, aws_env)
    client = aws_client_from_settings("sns", region="us-east-1", endpoint_url=settings.SNS_ENDPOINT_URL)
    assert client.meta.config.retries["total_max_attempts"] == 1
    assert client.meta.config.max_pool_connections == settings.PROVIDER_CONCURRENCY
