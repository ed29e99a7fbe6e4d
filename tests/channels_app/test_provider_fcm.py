"""FcmProvider: the real firebase-admin SDK against a local FCM v1 + OAuth stand-in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from channels_app.providers.base import (
    ConfigurationError,
    OutboundMessage,
    PermanentError,
    RetriableError,
    SendResult,
)
from channels_app.providers.fcm import FcmProvider
from tests.stubs.config import configure_settings
from tests.stubs.fcm import PROJECT_ID, FcmStub

pytest_plugins = ["tests.stubs.fixtures"]


def push(token: str = "tok-1", *, priority: str = "high", data: dict[str, Any] | None = None) -> OutboundMessage:
    return OutboundMessage(
        delivery_id=3,
        channel="push",
        address=token,
        content={"title": "Shipped", "body": "Order A-1 is on its way", "data": data or {"order": "A-1", "n": 2}},
        idempotency_key="d-3",
        priority=priority,
    )


@pytest.fixture
def provider(settings: Any, fcm_env: dict[str, str]) -> Iterator[FcmProvider]:
    """The provider built from settings, pointed at the stand-in."""
    configure_settings(settings, fcm_env)
    instance = FcmProvider.from_settings()
    yield instance
    instance.close()


def test_success_sends_title_body_and_string_data(provider: FcmProvider, fcm_stub: FcmStub) -> None:
    result = provider.send(push())
    assert result.provider_message_id.startswith(f"projects/{PROJECT_ID}/messages/")
    (send,) = fcm_stub.sends()
    assert send.route == f"/v1/projects/{PROJECT_ID}/messages:send"
    assert send.header(
        "Authorization",
    ).startswith("Bearer ya29.stub-")
    message = send.json()["message"]
    assert message["token"] == "tok-1"
    assert message["notification"] == {"title": "Shipped", "body": "Order A-1 is on its way"}
    assert message["data"] == {"order": "A-1", "n": "2"}  # FCM data values must be strings
    assert message["android"]["priority"] == "high"
    assert message["apns"]["headers"]["apns-priority"] == "10"


def test_low_priority(provider: FcmProvider, fcm_stub: FcmStub) -> None:
    provider.send(push(priority="low"))
    message = fcm_stub.sends()[0].json()["message"]
    assert message["android"]["priority"] == "normal" and message["apns"]["headers"]["apns-priority"] == "5"


def test_oauth_token_is_fetched_once_and_connections_reused(provider: FcmProvider, fcm_stub: FcmStub) -> None:
    for i in range(3):
        provider.send(push(f"tok-{i}"))
    token_requests = [r for r in fcm_stub.requests if r.route == fcm_stub.token_path]
    assert len(token_requests) == 1
    assert "grant_type=urn" in token_requests[0].body.decode()
    pools = provider.service._client.session.get_adapter(fcm_stub.url).poolmanager.pools
    assert len(pools) == 1 and next(iter(pools._container.values())).num_connections == 1


@pytest.mark.parametrize("code", ["UNREGISTERED", "SENDER_ID_MISMATCH", "INVALID_ARGUMENT"])
def test_token_errors_are_permanent_and_suppress(provider: FcmProvider, fcm_stub: FcmStub, code: str) -> None:
    fcm_stub.fail(code)
    with pytest.raises(PermanentError) as info:
        provider.send(push())
    assert info.value.code == code and info.value.suppress is True
    assert "tok-1" not in str(info.value)


def test_quota_exceeded_is_throttled_with_retry_after(provider: FcmProvider, fcm_stub: FcmStub) -> None:
    fcm_stub.fail("QUOTA_EXCEEDED", retry_after="30")
    with pytest.raises(RetriableError) as info:
        provider.send(push())
    assert info.value.code == "QUOTA_EXCEEDED" and info.value.throttled is True and info.value.retry_after == 30


@pytest.mark.parametrize("code", ["UNAVAILABLE", "INTERNAL"])
def test_server_errors_are_retriable_once_each(provider: FcmProvider, fcm_stub: FcmStub, code: str) -> None:
    fcm_stub.fail(code, retry_after="4")
    with pytest.raises(RetriableError) as info:
        provider.send(push())
    assert info.value.code == code and info.value.throttled is False and info.value.retry_after == 4
    # The SDK's own 4 retries with sleeps are off: the pipeline decides when to try again.
    assert len(fcm_stub.sends()) == 1


def test_read_timeout_is_retriable_and_maybe_sent(settings: Any, fcm_env: dict[str, str], fcm_stub: FcmStub) -> None:
    configure_settings(settings, {**fcm_env, "FCM_TIMEOUT_SECONDS": "0.5"})
    provider = FcmProvider.from_settings()
    try:
        provider.send(push())  # fetch the token before the stand-in starts hanging
        fcm_stub.hang(5, match=fcm_stub.match_token(None))
        with pytest.raises(RetriableError) as info:
            provider.send(push())
        assert info.value.maybe_sent is True
        assert len(fcm_stub.sends()) == 2  # no silent re-send after the timeout
    finally:
        provider.close()


def test_token_endpoint_failure_is_retriable(provider: FcmProvider, fcm_stub: FcmStub) -> None:
    fcm_stub.respond(500, {"error": "internal"}, match=lambda r: r.route == fcm_stub.token_path)
    with pytest.raises(RetriableError) as info:
        provider.send(push())
    assert info.value.code == "auth"
    assert fcm_stub.sends() == []


def test_batch_uses_send_each_with_per_token_outcomes(provider: FcmProvider, fcm_stub: FcmStub) -> None:
    fcm_stub.fail("UNREGISTERED", token="dead")
    fcm_stub.fail("QUOTA_EXCEEDED", token="busy", retry_after="12")
    messages = [push("a"), push("dead"), push("b"), push("busy"), push("")]
    outcomes = provider.send_batch(messages)
    assert isinstance(outcomes[0], SendResult) and isinstance(outcomes[2], SendResult)
    assert isinstance(outcomes[1], PermanentError) and outcomes[1].suppress
    assert isinstance(outcomes[3], RetriableError) and outcomes[3].throttled and outcomes[3].retry_after == 12
    # An empty token is refused locally without failing the rest of the batch.
    assert isinstance(outcomes[4], PermanentError) and outcomes[4].code == "invalid_message"
    assert sorted(r.json()["message"]["token"] for r in fcm_stub.sends()) == ["a", "b", "busy", "dead"]


def test_batch_is_chunked(settings: Any, fcm_env: dict[str, str], fcm_stub: FcmStub) -> None:
    configure_settings(settings, {**fcm_env, "FCM_BATCH_SIZE": "3"})
    provider = FcmProvider.from_settings()
    try:
        outcomes = provider.send_batch([push(f"t{i}") for i in range(7)])
    finally:
        provider.close()
    assert all(isinstance(o, SendResult) for o in outcomes) and len(outcomes) == 7
    assert len({o.provider_message_id for o in outcomes}) == 7
    assert len(fcm_stub.sends()) == 7


def test_from_settings_requires_the_credentials_file(settings: Any, fcm_env: dict[str, str]) -> None:
    configure_settings(settings, {**fcm_env, "FCM_CREDENTIALS_FILE": "", "GOOGLE_APPLICATION_CREDENTIALS": ""})
    with pytest.raises(ConfigurationError, match="FCM_CREDENTIALS_FILE"):
        FcmProvider.from_settings()


def test_from_settings_rejects_a_bad_credentials_file(settings: Any, fcm_env: dict[str, str], tmp_path: Any) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": "authorized_user"}))
    configure_settings(settings, {**fcm_env, "FCM_CREDENTIALS_FILE": str(bad)})
    with pytest.raises(ConfigurationError, match="FCM_CREDENTIALS_FILE"):
        FcmProvider.from_settings()
