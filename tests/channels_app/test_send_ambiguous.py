"""An ambiguous attempt pins its delivery to its provider, whatever deferrals follow (Twilio and SNS stand-ins)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from channels_app.providers.base import OutboundMessage, RetriableError
from channels_app.providers.twilio_sms import TwilioProvider
from notifier.accepting.services import notification_accept
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from preferences.services import recipient_upsert
from templates_app.services import template_put
from tests.conftest import wait_for
from tests.stubs import twilio
from tests.stubs.config import SMS_FROM
from tests.stubs.smtp import free_port


@pytest.mark.django_db(transaction=True)
def test_read_timeout_then_open_breaker_the_delivery_waits_and_never_fails_over(
    start_worker: Any, twilio_stub: Any, twilio_env: dict[str, str], aws_stub: Any, aws_env: dict[str, str]
) -> None:
    """Twilio times out (ambiguous); its breaker opens; the delivery waits for Twilio and is sent by Twilio."""
    template_put(key="otp", category="security", default_locale="en", content={"en": {"sms": {"text": "Code 1"}}})
    recipient_upsert(user_id="amb-1", phone="+14155550111")
    client = api_client_create(name="amb")[0]
    twilio_stub.hang(30.0, times=1)  # the first attempt reaches Twilio and gets no answer in time
    breakers = {"twilio": {"min_calls": 1, "failure_threshold": 0.5, "cooldown_seconds": 4, "half_open_probes": 1}}
    env = {
        **twilio_env,
        **aws_env,
        "SMS_PROVIDERS": "twilio,sns",
        "TWILIO_TIMEOUT_SECONDS": "1",
        "RETRY_BACKOFF_BASE_SECONDS": "0.5",
        "RETRY_BACKOFF_MAX_SECONDS": "1",
        "PROVIDER_CIRCUIT_BREAKERS": json.dumps(breakers),
        "RESILIENCE_ASSUMED_WORKERS": "1",
    }
    start_worker(queues=["sms.high"], env=env, concurrency=1)
    [delivery] = notification_accept(
        client=client,
        data={"recipient": {"user_id": "amb-1"}, "category": "security", "template": "otp", "channels": ["sms"]},
    ).deliveries

    sent = wait_for(lambda: Delivery.objects.filter(pk=delivery.pk, status="sent").first(), timeout=60)

    assert sent.provider == "twilio" and sent.pinned_provider == "twilio"
    events = list(sent.events.values_list("status", "detail"))
    assert any(s == "queued" and "ambiguous" in d for s, d in events), events
    assert any(s == "deferred" and d == "breaker_open" for s, d in events), events  # it waited for Twilio
    assert not any(s == "failover" for s, _ in events)
    assert aws_stub.sns_publishes() == []  # never re-sent through SNS
    assert len(twilio_stub.messages()) == 2  # the ambiguous attempt and the one that succeeded


@pytest.fixture
def hangup_server() -> Iterator[int]:
    """A server on 127.0.0.1 that reads a request and closes the connection without answering."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.settimeout(2)
            try:
                conn.recv(65536)
            except OSError:
                pass
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    stop.set()
    thread.join(timeout=2)
    listener.close()


def _provider(port: int) -> TwilioProvider:
    return TwilioProvider(
        account_sid=twilio.ACCOUNT_SID,
        auth_token=twilio.AUTH_TOKEN,
        from_number=SMS_FROM,
        base_url=f"http://127.0.0.1:{port}",
        timeout=2,
    )


MESSAGE = OutboundMessage(
    delivery_id=1, channel="sms", address="+14155550112", content={"text": "x"}, idempotency_key="d"
)


@pytest.mark.pure
def test_twilio_connection_aborted_after_the_request_was_written_is_ambiguous(hangup_server: int) -> None:
    with pytest.raises(RetriableError) as caught:
        _provider(hangup_server).send(MESSAGE)
    assert caught.value.maybe_sent and caught.value.code == "connection_error"


@pytest.mark.pure
def test_twilio_connection_refused_is_not_ambiguous() -> None:
    with pytest.raises(RetriableError) as caught:
        _provider(free_port()).send(MESSAGE)
    assert not caught.value.maybe_sent
