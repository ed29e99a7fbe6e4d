"""Twilio message status callbacks at POST /callbacks/twilio, signed with X-Twilio-Signature."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pytest
from django.urls import include, path
from rest_framework.test import APIClient
from twilio.request_validator import RequestValidator

from notifier.models import Delivery
from preferences.models import Suppression
from tests.test_callbacks_ses import make_delivery, snapshot

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
    resp = APIClient().post("/callbacks/twilio", data={"MessageSid": d.provider_message_id}, format="json")
    assert resp.status_code == 400


def test_signature_for_the_configured_status_callback_url_is_accepted(settings: Any) -> None:
    """Twilio signs the StatusCallback URL sent with the message, which a proxy may map to our path."""
    settings.TWILIO_STATUS_CALLBACK_URL = "https://hooks.example.com/notifier/twilio-status?k=1"
    d = sms_delivery()
    params = status_params(d, "delivered")
    signature = RequestValidator(TOKEN).compute_signature(settings.TWILIO_STATUS_CALLBACK_URL, params)
    assert post(params, signature=signature).status_code == 200
    d.refresh_from_db()
    assert d.status == "delivered"
