"""WebhookProvider against a loopback receiver: signatures, outcomes, and the SSRF guard."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest
import requests
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from channels_app.providers.base import OutboundMessage, PermanentError, RetriableError, parse_retry_after
from channels_app.providers.webhook import WebhookProvider
from core.ssrf import UnsafeTargetError, address_refusal, resolve_target
from tests.stubs.config import WEBHOOK_SECRET, configure_settings
from tests.stubs.webhook import WebhookReceiver

pytest_plugins = ["tests.stubs.fixtures"]


def make_message(
    url: str, *, body: Any = None, key: str = "dlv-1", secret: str | None = WEBHOOK_SECRET
) -> OutboundMessage:
    meta = {"webhook_secret": secret} if secret else {}
    return OutboundMessage(
        delivery_id=1,
        channel="webhook",
        address=url,
        content={"body": body if body is not None else {"event": "order.shipped", "order": "A-1"}},
        idempotency_key=key,
        meta=meta,
    )


@pytest.fixture
def provider() -> WebhookProvider:
    """A provider that may reach loopback (the stand-in receiver)."""
    return WebhookProvider(allow_private=True, connect_timeout=1, read_timeout=1)


@pytest.fixture
def strict() -> WebhookProvider:
    """A provider with the production policy: public addresses only."""
    return WebhookProvider(allow_private=False, connect_timeout=1, read_timeout=1)


def test_success_is_signed_per_standard_webhooks(provider: WebhookProvider, webhook_receiver: WebhookReceiver) -> None:
    result = provider.send(make_message(f"{webhook_receiver.url}/hook", body={"event": "e", "n": "é"}, key="k-42"))

    assert result.provider_message_id == "k-42"
    (request,) = webhook_receiver.requests
    assert request.method == "POST" and request.route == "/hook"
    assert request.header("webhook-id") == "k-42"
    assert request.header("Content-Type") == "application/json"
    # The independent reference implementation accepts our signature and returns the payload.
    verified = Webhook(WEBHOOK_SECRET).verify(request.body, request.headers)
    assert verified == {"event": "e", "n": "é"}


def test_tampered_body_does_not_verify(provider: WebhookProvider, webhook_receiver: WebhookReceiver) -> None:
    provider.send(make_message(webhook_receiver.url))
    (request,) = webhook_receiver.requests
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(WEBHOOK_SECRET).verify(request.body.replace(b"A-1", b"A-2"), request.headers)


def test_settings_secret_is_the_fallback(webhook_receiver: WebhookReceiver) -> None:
    provider = WebhookProvider(signing_secret=WEBHOOK_SECRET, allow_private=True)
    provider.send(make_message(webhook_receiver.url, secret=None))
    (request,) = webhook_receiver.requests
    Webhook(WEBHOOK_SECRET).verify(request.body, request.headers)


def test_no_secret_anywhere_is_permanent(provider: WebhookProvider, webhook_receiver: WebhookReceiver) -> None:
    with pytest.raises(PermanentError) as info:
        provider.send(make_message(webhook_receiver.url, secret=None))
    assert info.value.code == "no_secret"
    assert webhook_receiver.requests == []


def test_from_settings_rejects_a_malformed_secret(settings: Any) -> None:
    from channels_app.providers.base import ConfigurationError

    settings.WEBHOOK_SIGNING_SECRET = "whsec_not base64!"
    with pytest.raises(ConfigurationError, match="whsec_"):
        WebhookProvider.from_settings()


def test_connection_is_kept_alive(provider: WebhookProvider, webhook_receiver: WebhookReceiver) -> None:
    ports = set()
    for i in range(3):
        provider.send(make_message(webhook_receiver.url, key=f"k{i}"))
    for request in webhook_receiver.requests:
        ports.add(request.header("Host"))
    # One pool for the pinned address; urllib3 reuses its connection.
    adapter = provider.session.get_adapter(webhook_receiver.url)
    assert len(adapter.poolmanager.pools) == 1
    pool = next(iter(adapter.poolmanager.pools._container.values()))
    assert pool.num_connections == 1
    assert len(webhook_receiver.requests) == 3


def test_410_is_permanent_and_suppresses(provider: WebhookProvider, webhook_receiver: WebhookReceiver) -> None:
    webhook_receiver.respond(410, {"error": "gone"})
    with pytest.raises(PermanentError) as info:
        provider.send(make_message(webhook_receiver.url))
    assert info.value.suppress is True and info.value.code == "http_410"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_other_4xx_is_permanent_without_suppression(
    provider: WebhookProvider, webhook_receiver: WebhookReceiver, status: int
) -> None:
    webhook_receiver.respond(status, {"error": "no"})
    with pytest.raises(PermanentError) as info:
        provider.send(make_message(webhook_receiver.url))
    assert info.value.suppress is False and info.value.code == f"http_{status}"


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_5xx_is_retriable(provider: WebhookProvider, webhook_receiver: WebhookReceiver, status: int) -> None:
    webhook_receiver.respond(status, b"oops")
    with pytest.raises(RetriableError) as info:
        provider.send(make_message(webhook_receiver.url))
    assert info.value.throttled is False and info.value.maybe_sent is False


def test_429_is_throttled_with_retry_after(provider: WebhookProvider, webhook_receiver: WebhookReceiver) -> None:
    webhook_receiver.respond(429, b"", headers={"Retry-After": "17"})
    with pytest.raises(RetriableError) as info:
        provider.send(make_message(webhook_receiver.url))
    assert info.value.throttled is True and info.value.retry_after == 17


def test_503_with_http_date_retry_after(provider: WebhookProvider, webhook_receiver: WebhookReceiver) -> None:
    webhook_receiver.respond(503, b"", headers={"Retry-After": "Wed, 21 Oct 2037 07:28:00 GMT"})
    with pytest.raises(RetriableError) as info:
        provider.send(make_message(webhook_receiver.url))
    assert info.value.retry_after is not None and info.value.retry_after > 3600


def test_parse_retry_after() -> None:
    assert parse_retry_after("5") == 5
    assert parse_retry_after("-3") == 0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:10 GMT", now=0) == 10


def test_read_timeout_is_retriable_and_maybe_sent(provider: WebhookProvider, webhook_receiver: WebhookReceiver) -> None:
    webhook_receiver.hang(10)
    with pytest.raises(RetriableError) as info:
        provider.send(make_message(webhook_receiver.url))
    assert info.value.code == "read_timeout" and info.value.maybe_sent is True
    assert len(webhook_receiver.requests) == 1


def test_refused_connection_is_retriable_not_maybe_sent(provider: WebhookProvider) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once the socket closes
    with pytest.raises(RetriableError) as info:
        provider.send(make_message(f"http://127.0.0.1:{port}/"))
    assert info.value.maybe_sent is False and info.value.code == "connection_error"


def test_redirect_is_not_followed(provider: WebhookProvider, webhook_receiver: WebhookReceiver) -> None:
    with WebhookReceiver() as target:
        webhook_receiver.redirect_to(f"{target.url}/elsewhere")
        with pytest.raises(PermanentError) as info:
            provider.send(make_message(f"{webhook_receiver.url}/hook"))
        assert info.value.code == "http_302"
        assert target.requests == []
    assert len(webhook_receiver.requests) == 1


def test_non_http_scheme_is_refused(provider: WebhookProvider) -> None:
    with pytest.raises(PermanentError) as info:
        provider.send(make_message("file:///etc/passwd"))
    assert info.value.code == "bad_url"


# --- SSRF guard ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.0.0.2", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"),
        ("100.64.0.1", "private"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.100.100.200", "metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
    ],
)
def test_guard_refuses_internal_addresses(address: str, reason: str) -> None:
    assert address_refusal(address, allow_private=False) == reason


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111"])
def test_guard_allows_public_addresses(address: str) -> None:
    assert address_refusal(address, allow_private=False) is None


def test_allow_private_opens_loopback_and_private_but_never_metadata() -> None:
    assert address_refusal("127.0.0.1", allow_private=True) is None
    assert address_refusal("10.0.0.1", allow_private=True) is None
    assert address_refusal("169.254.169.254", allow_private=True) == "metadata"
    assert address_refusal("169.254.1.1", allow_private=True) == "link-local"


def test_resolution_checks_names_and_numeric_forms() -> None:
    for host in ("localhost", "2130706433", "127.0.0.2", "::1", "[::1]", "0x7f000001"):
        with pytest.raises(UnsafeTargetError) as info:
            resolve_target(host, 80, allow_private=False)
        assert info.value.reason == "loopback", host


@pytest.mark.parametrize(
    "url_template",
    [
        "http://127.0.0.1:{port}/hook",
        "http://127.0.0.2:{port}/hook",
        "http://localhost:{port}/hook",
        "http://2130706433:{port}/hook",
        "http://[::1]:{port}/hook",
    ],
)
def test_loopback_targets_are_refused_end_to_end(
    strict: WebhookProvider, webhook_receiver: WebhookReceiver, url_template: str
) -> None:
    with pytest.raises(PermanentError) as info:
        strict.send(make_message(url_template.format(port=webhook_receiver.port)))
    assert info.value.code == "unsafe_target"
    # The guard decided before connecting: nothing reached the receiver.
    assert webhook_receiver.requests == []


def test_redirect_to_loopback_is_not_followed_with_guard_on(
    webhook_receiver: WebhookReceiver, provider: WebhookProvider
) -> None:
    # Even a receiver we may reach cannot bounce us somewhere else.
    with WebhookReceiver() as internal:
        webhook_receiver.redirect_to(f"http://localhost:{internal.port}/admin")
        with pytest.raises(PermanentError):
            provider.send(make_message(webhook_receiver.url))
        assert internal.requests == []


def test_setting_on_delivers_to_loopback_via_from_settings(settings: Any, webhook_receiver: WebhookReceiver) -> None:
    configure_settings(settings, {"WEBHOOK_SIGNING_SECRET": WEBHOOK_SECRET})
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = True
    provider = WebhookProvider.from_settings()
    provider.send(make_message(webhook_receiver.url, secret=None))
    assert len(webhook_receiver.requests) == 1


def test_setting_off_refuses_loopback_via_from_settings(settings: Any, webhook_receiver: WebhookReceiver) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = False
    provider = WebhookProvider.from_settings()
    with pytest.raises(PermanentError):
        provider.send(make_message(webhook_receiver.url))
    assert webhook_receiver.requests == []


def test_batch_sends_concurrently_with_per_message_outcomes(
    provider: WebhookProvider, webhook_receiver: WebhookReceiver
) -> None:
    webhook_receiver.respond(410, b"", match=lambda r: r.route == "/gone")
    messages = [make_message(f"{webhook_receiver.url}/ok", key=f"k{i}") for i in range(5)]
    messages.insert(2, make_message(f"{webhook_receiver.url}/gone", key="gone"))
    outcomes = provider.send_batch(messages)
    assert [type(o).__name__ for o in outcomes] == ["SendResult"] * 2 + ["PermanentError"] + ["SendResult"] * 3
    assert sorted(str(r.header("webhook-id")) for r in webhook_receiver.requests) == sorted(
        m.idempotency_key for m in messages
    )


def test_signature_uses_the_timestamp_header(provider: WebhookProvider) -> None:
    body, headers = provider.build_request(make_message("http://example.invalid/"), timestamp=int(time.time()) - 3600)
    # An old timestamp is rejected by the verifier (replay protection on the receiver's side).
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(WEBHOOK_SECRET).verify(body, headers)
    assert json.loads(body) == {"event": "order.shipped", "order": "A-1"}


def test_unsafe_target_error_is_a_requests_error() -> None:
    assert issubclass(UnsafeTargetError, requests.RequestException)
