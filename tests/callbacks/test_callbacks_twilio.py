"""Twilio message status callbacks at POST /callbacks/twilio, signed with X-Twilio-Signature."""

from __future__ import annotations

import io
from typing import Any
from urllib.parse import urlencode

import pytest
from django.urls import include, path
from rest_framework.test import APIClient
from twilio.request_validator import RequestValidator

from notifier.deliveries.models import Delivery
from preferences.models import Suppression
from tests.callbacks.test_callbacks_ses import make_delivery, snapshot

urlpatterns = [path("callbacks/", include("notifier.callbacks.urls"))]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]

TOKEN = "twilio-test-auth-token"
PUBLIC = "https://notifier.example.com"
PUBLIC_URL = f"{PUBLIC}/callbacks/twilio"


@pytest.fixture(autouse=True)
def _twilio_settings(settings: Any) -> None:
    settings.TWILIO_AUTH_TOKEN = TOKEN
    settings.PUBLIC_BASE_URL = PUBLIC


def sms_delivery(**kwargs: Any) -> Delivery:
    return make_delivery(provider="twilio", channel="sms", address="+15005550006", **kwargs)


def status_params(delivery: Delivery, status: str, **extra: str) -> dict[str, str]:
    return {
        "MessageSid": delivery.provider_message_id,
        "SmsSid": delivery.provider_message_id,
        "MessageStatus": status,
        "SmsStatus": status,
        "AccountSid": "AC00000000000000000000000000000000",
        "To": delivery.address,
        "From": "+15005550001",
        "ApiVersion": "2010-04-01",
        **extra,
    }


def post(params: dict[str, str], *, signature: str | None = None, url: str = PUBLIC_URL, path: str = "") -> Any:
    """POST a form as Twilio does, signed for `url` unless a signature is given."""
    if signature is None:
        signature = RequestValidator(TOKEN).compute_signature(url, params)
    headers = {"X-Twilio-Signature": signature} if signature else {}
    return APIClient().post(
        "/callbacks/twilio" + path,
        data=urlencode(params),
        content_type="application/x-www-form-urlencoded",
        headers=headers,
    )


def test_delivered_marks_delivered() -> None:
    d = sms_delivery()
    resp = post(status_params(d, "delivered"))
    assert resp.status_code == 200, resp.content
    d.refresh_from_db()
    assert d.status == "delivered"
    assert list(d.events.values_list("status", "detail")) == [("delivered", "twilio:delivered")]


def test_signature_over_the_url_with_its_query_string() -> None:
    d = sms_delivery()
    params = status_params(d, "delivered")
    signature = RequestValidator(TOKEN).compute_signature(PUBLIC_URL + "?tenant=a", params)
    assert post(params, signature=signature, path="?tenant=a").status_code == 200


@pytest.mark.parametrize("status", ["undelivered", "failed"])
def test_undelivered_and_failed_mark_failed_without_suppression(status: str) -> None:
    d = sms_delivery()
    assert post(status_params(d, status, ErrorCode="30003")).status_code == 200
    d.refresh_from_db()
    assert d.status == "failed"
    assert "30003" in d.last_error
    assert not Suppression.objects.exists()


def test_unsubscribed_number_is_suppressed_as_stop() -> None:
    d = sms_delivery()
    assert post(status_params(d, "undelivered", ErrorCode="21610")).status_code == 200
    d.refresh_from_db()
    assert d.status == "failed"
    assert Suppression.objects.get(channel="sms", address="+15005550006").source == "stop"


@pytest.mark.parametrize("status", ["sent", "queued"])
def test_sent_and_queued_record_an_event_once(status: str) -> None:
    d = sms_delivery()
    assert post(status_params(d, status)).status_code == 200
    assert post(status_params(d, status)).status_code == 200
    d.refresh_from_db()
    assert d.status == "sent"
    assert list(d.events.values_list("status", "detail")) == [("sent", f"twilio:{status}")]


def test_late_and_repeated_callbacks_never_move_backwards() -> None:
    d = sms_delivery()
    assert post(status_params(d, "delivered")).status_code == 200
    before = snapshot(d)
    for status in ("delivered", "failed", "undelivered"):
        assert post(status_params(d, status, ErrorCode="30005")).status_code == 200
    after = snapshot(d)
    assert after[0] == "delivered"
    assert after[1][0] == before[1][0] and [e[0] for e in after[1]] == ["delivered"]


def test_callback_for_another_provider_changes_nothing() -> None:
    d = make_delivery(provider="sns", channel="sms", address="+15005550006")
    before = snapshot(d)
    assert post(status_params(d, "delivered")).status_code == 200
    assert snapshot(d) == before


@pytest.mark.parametrize("case", ["forged", "missing", "wrong_url", "wrong_token"])
def test_bad_signatures_are_rejected_and_change_nothing(case: str) -> None:
    d = sms_delivery()
    params = status_params(d, "delivered")
    signature = {
        "forged": "bm90IGEgcmVhbCBzaWduYXR1cmU=",
        "missing": "",
        "wrong_url": RequestValidator(TOKEN).compute_signature("https://attacker.example/callbacks/twilio", params),
        "wrong_token": RequestValidator("another-token").compute_signature(PUBLIC_URL, params),
    }[case]
    before = snapshot(d)
    resp = post(params, signature=signature)
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "invalid_signature"
    assert snapshot(d) == before


def test_tampered_parameters_are_rejected() -> None:
    d = sms_delivery()
    params = status_params(d, "sent")
    signature = RequestValidator(TOKEN).compute_signature(PUBLIC_URL, params)
    params["MessageStatus"] = params["SmsStatus"] = "undelivered"
    params["ErrorCode"] = "21610"
    before = snapshot(d)
    assert post(params, signature=signature).status_code == 403
    assert snapshot(d) == before


def test_without_a_configured_token_everything_is_rejected(settings: Any) -> None:
    d = sms_delivery()
    params = status_params(d, "delivered")
    signature = RequestValidator(TOKEN).compute_signature(PUBLIC_URL, params)
    settings.TWILIO_AUTH_TOKEN = ""
    before = snapshot(d)
    assert post(params, signature=signature).status_code == 403
    assert snapshot(d) == before


def test_signed_but_without_status_is_a_400() -> None:
    d = sms_delivery()
    params = {"MessageSid": d.provider_message_id, "AccountSid": "AC0"}
    before = snapshot(d)
    resp = post(params)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "malformed_callback"
    assert snapshot(d) == before


def test_json_body_is_a_400() -> None:
    d = sms_delivery()
    resp = APIClient().post(
        "/callbacks/twilio",
        data={"MessageSid": d.provider_message_id},
        format="json",
        headers={"X-Twilio-Signature": "c2lnbmVk"},
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "malformed_callback"


class CountingStream(io.BytesIO):
    """A request body that records how many bytes the view read of it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.bytes_read += len(chunk)
        return chunk

    def readline(self, size: int | None = -1) -> bytes:
        line = super().readline(size)
        self.bytes_read += len(line)
        return line


def post_stream(body: bytes, headers: dict[str, str], **meta: Any) -> tuple[Any, CountingStream]:
    stream = CountingStream(body)
    resp = APIClient().generic(
        "POST",
        "/callbacks/twilio",
        content_type="application/x-www-form-urlencoded",
        headers=headers,
        **environ(stream, str(len(body)), **meta),
    )
    return resp, stream


def environ(stream: CountingStream, length: str, **meta: Any) -> dict[str, Any]:
    """Return the WSGI environ entries that put `stream` in place of the test client's body."""
    return {"wsgi.input": stream, "CONTENT_LENGTH": length, **meta}


def test_unsigned_request_is_rejected_without_reading_its_body() -> None:
    d = sms_delivery()
    body = urlencode(status_params(d, "delivered", Body="x" * 200_000)).encode()
    before = snapshot(d)
    resp, stream = post_stream(body, {})
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "invalid_signature"
    assert stream.bytes_read == 0
    assert snapshot(d) == before


def test_without_a_token_the_body_is_not_read(settings: Any) -> None:
    settings.TWILIO_AUTH_TOKEN = ""
    d = sms_delivery()
    body = urlencode(status_params(d, "delivered")).encode()
    resp, stream = post_stream(body, {"X-Twilio-Signature": "c2lnbmVk"})
    assert resp.status_code == 403
    assert stream.bytes_read == 0


def test_signed_but_oversized_body_is_a_413_and_is_not_read(settings: Any) -> None:
    settings.TWILIO_CALLBACK_MAX_BYTES = 4096
    d = sms_delivery()
    params = status_params(d, "delivered", Body="x" * 8000)
    signature = RequestValidator(TOKEN).compute_signature(PUBLIC_URL, params)
    before = snapshot(d)
    resp, stream = post_stream(urlencode(params).encode(), {"X-Twilio-Signature": signature})
    assert resp.status_code == 413
    err = resp.json()["error"]
    assert err["code"] == "payload_too_large" and "body" in err["fields"]
    assert stream.bytes_read == 0
    assert snapshot(d) == before


def test_body_longer_than_its_declared_length_is_read_only_to_the_bound(settings: Any) -> None:
    """A Content-Length that understates the body never lets more than the bound (plus one byte) in."""
    settings.TWILIO_CALLBACK_MAX_BYTES = 4096
    d = sms_delivery()
    params = status_params(d, "delivered", Body="x" * 50_000)
    signature = RequestValidator(TOKEN).compute_signature(PUBLIC_URL, params)
    body = urlencode(params).encode()
    stream = CountingStream(body)
    before = snapshot(d)
    # Declared length within the bound; Django's stream then stops at it, so what is read is bounded
    # by the declaration, and the truncated form fails the signature check.
    resp = APIClient().generic(
        "POST",
        "/callbacks/twilio",
        content_type="application/x-www-form-urlencoded",
        headers={"X-Twilio-Signature": signature},
        **environ(stream, "4000"),
    )
    assert resp.status_code == 403
    assert stream.bytes_read <= 4097
    assert snapshot(d) == before


def test_signed_callback_at_the_bound_is_applied(settings: Any) -> None:
    d = sms_delivery()
    params = status_params(d, "delivered")
    body = urlencode(params).encode()
    settings.TWILIO_CALLBACK_MAX_BYTES = len(body)
    resp = post(params)
    assert resp.status_code == 200, resp.content
    d.refresh_from_db()
    assert d.status == "delivered"


def test_signature_for_the_configured_status_callback_url_is_accepted(settings: Any) -> None:
    """Twilio signs the StatusCallback URL sent with the message, which a proxy may map to our path."""
    settings.TWILIO_STATUS_CALLBACK_URL = "https://hooks.example.com/notifier/twilio-status?k=1"
    d = sms_delivery()
    params = status_params(d, "delivered")
    signature = RequestValidator(TOKEN).compute_signature(settings.TWILIO_STATUS_CALLBACK_URL, params)
    assert post(params, signature=signature).status_code == 200
    d.refresh_from_db()
    assert d.status == "delivered"


def test_a_projects_twilio_account_signs_callbacks_for_its_own_deliveries(settings: Any) -> None:
    """A delivery sent through a named account: its callback is signed with that account's token and found."""
    settings.PROVIDER_ACCOUNTS = {
        "shop-sms": {"provider": "twilio", "account_sid": "AC" + "1" * 32, "auth_token": "shop-account-token"},
        "shop-mail": {"provider": "smtp", "host": "127.0.0.1", "password": "not-a-twilio-token"},
    }
    d = make_delivery(provider="shop-sms", channel="sms", address="+15005550006")
    params = status_params(d, "delivered")
    signed = RequestValidator("shop-account-token").compute_signature(PUBLIC_URL, params)
    assert post(params, signature=signed).status_code == 200
    d.refresh_from_db()
    assert d.status == "delivered"
    # A token no account has (an SMTP account's password is not one) signs nothing.
    forged = RequestValidator("not-a-twilio-token").compute_signature(PUBLIC_URL, status_params(d, "failed"))
    assert post(status_params(d, "failed"), signature=forged).status_code == 403
    # Without the account configured any more, its deliveries' callbacks no longer verify.
    settings.PROVIDER_ACCOUNTS = {}
    failed = status_params(d, "failed")
    signed = RequestValidator("shop-account-token").compute_signature(PUBLIC_URL, failed)
    assert post(failed, signature=signed).status_code == 403
    d.refresh_from_db()
    assert d.status == "delivered"


def test_a_projects_whatsapp_account_signs_callbacks_for_its_own_deliveries(settings: Any) -> None:
    """WhatsApp messages are Twilio's too: the installation's and an account's deliveries are found and moved."""
    settings.PROVIDER_ACCOUNTS = {
        "shop-whatsapp": {
            "provider": "twilio_whatsapp",
            "account_sid": "AC" + "2" * 32,
            "auth_token": "shop-whatsapp-token",
            "from_number": "+15005550088",
        },
    }
    own = make_delivery(provider="shop-whatsapp", channel="whatsapp", address="+15005550006")
    params = status_params(own, "read")
    signed = RequestValidator("shop-whatsapp-token").compute_signature(PUBLIC_URL, params)
    assert post(params, signature=signed).status_code == 200
    own.refresh_from_db()
    assert own.status == "opened"
    # The installation's WhatsApp sender (signed with TWILIO_AUTH_TOKEN); a STOP suppresses the WhatsApp address.
    installation = make_delivery(provider="twilio_whatsapp", channel="whatsapp", address="+15005550007")
    assert post(status_params(installation, "undelivered", ErrorCode="21610")).status_code == 200
    installation.refresh_from_db()
    assert installation.status == "failed"
    assert list(Suppression.objects.values_list("channel", "address")) == [("whatsapp", "+15005550007")]
