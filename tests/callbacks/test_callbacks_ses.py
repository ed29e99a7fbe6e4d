"""SES events over SNS at POST /callbacks/ses: signature (v1, v2), topic, replay window and replay checks.

The SNS signing certificate is generated here and served from a loopback stub whose host the test allows
through SNS_CERT_URL_ALLOWED_HOSTS; the string to sign is rebuilt here from AWS's documentation, not taken
from the code under test.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID
from django.conf import settings
from django.urls import include, path
from rest_framework.test import APIClient

from notifier.callbacks import verify
from notifier.deliveries.models import Delivery, DeliveryEvent
from preferences.models import Suppression
from tests import factories

urlpatterns = [path("callbacks/", include("notifier.callbacks.urls"))]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]

TOPIC_ARN = "arn:aws:sns:us-east-1:123456789012:ses-events"
URL = "/callbacks/ses"


# --- a signing certificate and the loopback "SNS host" that serves it ---------------------------------


def make_cert(common_name: str = "sns.amazonaws.com") -> tuple[rsa.RSAPrivateKey, bytes]:
    """Return a fresh RSA key and a self-signed PEM certificate for it."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return key, cert.public_bytes(serialization.Encoding.PEM)


@dataclass
class SnsStub:
    """A loopback HTTP server serving PEM files by path and recording every GET (cert fetches, confirms)."""

    files: dict[str, bytes] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def start(self) -> SnsStub:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stub.hits.append(self.path)
                body = stub.files.get(self.path.split("?")[0], b"<ConfirmSubscriptionResponse/>")
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def stop(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def signing() -> tuple[rsa.RSAPrivateKey, bytes]:
    return make_cert()


@pytest.fixture(scope="module")
def _stub_server(signing: tuple[rsa.RSAPrivateKey, bytes]) -> Iterator[SnsStub]:
    stub = SnsStub(files={"/SimpleNotificationService-test.pem": signing[1]}).start()
    yield stub
    stub.stop()


@pytest.fixture
def stub(_stub_server: SnsStub, settings: Any) -> SnsStub:
    """The SNS stand-in, trusted through the test-only settings; a fresh cert cache and request log."""
    settings.SES_CALLBACK_TOPIC_ARNS = [TOPIC_ARN]
    settings.SNS_CERT_URL_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.SNS_CERT_URL_ALLOW_HTTP = True
    _stub_server.hits.clear()
    verify.cert_cache.clear()
    verify.fetch_budget.reset()
    return _stub_server


# --- building signed SNS messages --------------------------------------------------------------------

NOTIFICATION_KEYS = ["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"]
SUBSCRIPTION_KEYS = ["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"]


def sns_timestamp(at: dt.datetime | None = None) -> str:
    at = at or dt.datetime.now(dt.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def sign(message: dict[str, Any], key: rsa.RSAPrivateKey, version: str = "1") -> dict[str, Any]:
    """Sign the message as SNS does: "Key\\nValue\\n" for each present key in the documented order."""
    keys = NOTIFICATION_KEYS if message["Type"] == "Notification" else SUBSCRIPTION_KEYS
    text = "".join(f"{k}\n{message[k]}\n" for k in keys if k in message)
    algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()
    signature = key.sign(text.encode(), padding.PKCS1v15(), algorithm)
    return {**message, "SignatureVersion": version, "Signature": base64.b64encode(signature).decode()}


def notification(
    event: dict[str, Any],
    stub: SnsStub,
    key: rsa.RSAPrivateKey,
    *,
    version: str = "1",
    topic: str = TOPIC_ARN,
    at: dt.datetime | None = None,
    cert_url: str | None = None,
    message_id: str | None = None,
) -> dict[str, Any]:
    """Return a signed SNS Notification carrying `event`."""
    message = {
        "Type": "Notification",
        "MessageId": message_id or str(uuid.uuid4()),
        "TopicArn": topic,
        "Message": json.dumps(event),
        "Timestamp": sns_timestamp(at),
        "SigningCertURL": cert_url or stub.url("/SimpleNotificationService-test.pem"),
        "UnsubscribeURL": stub.url("/unsubscribe"),
    }
    return sign(message, key, version)


def ses_event(kind: str, ses_message_id: str, **body: Any) -> dict[str, Any]:
    """Return an SES event in the event-publishing format."""
    event: dict[str, Any] = {"eventType": kind, "mail": {"messageId": ses_message_id, "source": "app@example.org"}}
    event.update(body)
    return event


def post(message: Any) -> Any:
    raw = message if isinstance(message, str | bytes) else json.dumps(message)
    return APIClient().post(URL, data=raw, content_type="text/plain; charset=UTF-8")


# --- deliveries --------------------------------------------------------------------------------------


def make_delivery(
    *, provider: str = "ses", provider_message_id: str | None = None, address: str = "reader@example.com", **kw: Any
) -> Delivery:
    """Create a sent SES delivery with a provider message id of its own (tests.factories does the rest)."""
    message_id = provider_message_id or f"0100-{uuid.uuid4().hex[:12]}"
    return factories.make_delivery(provider=provider, provider_message_id=message_id, address=address, **kw)


def snapshot(delivery: Delivery) -> tuple[str, list[tuple[str, str]], int]:
    """Return what a callback may change: the status, the event history and the suppression count."""
    delivery.refresh_from_db()
    events = list(DeliveryEvent.objects.filter(delivery=delivery).values_list("status", "detail"))
    return delivery.status, events, Suppression.objects.count()


# --- accepted events ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1", "2"])
def test_delivery_event_marks_delivered(stub: SnsStub, signing: Any, version: str) -> None:
    d = make_delivery()
    resp = post(notification(ses_event("Delivery", d.provider_message_id), stub, signing[0], version=version))
    assert resp.status_code == 200, resp.content
    d.refresh_from_db()
    assert d.status == "delivered"
    assert list(d.events.values_list("status", flat=True)) == ["delivered"]


def test_notification_format_and_subject_are_accepted(stub: SnsStub, signing: Any) -> None:
    """SES identity notifications say notificationType; a Subject joins the signed string when present."""
    d = make_delivery()
    event = {"notificationType": "Delivery", "mail": {"messageId": d.provider_message_id}}
    message = notification(event, stub, signing[0])
    message.pop("Signature")
    message["Subject"] = "Amazon SES Email Event Notification"
    resp = post(sign(message, signing[0], "2"))
    assert resp.status_code == 200, resp.content
    d.refresh_from_db()
    assert d.status == "delivered"


def test_permanent_bounce_bounces_and_suppresses(stub: SnsStub, signing: Any) -> None:
    d = make_delivery(address="gone@example.com")
    event = ses_event(
        "Bounce",
        d.provider_message_id,
        bounce={
            "bounceType": "Permanent",
            "bounceSubType": "NoEmail",
            "bouncedRecipients": [{"emailAddress": "Gone@Example.com", "diagnosticCode": "550 no such user"}],
        },
    )
    resp = post(notification(event, stub, signing[0]))
    assert resp.status_code == 200, resp.content
    d.refresh_from_db()
    assert d.status == "bounced"
    assert list(d.events.values_list("status", flat=True)) == ["bounced"]
    supp = Suppression.objects.get(channel="email", address="gone@example.com")
    assert supp.source == "bounce"
    # The diagnostic can name the address: it is not copied into the delivery's history.
    assert "gone@" not in d.last_error.lower() and "gone@" not in d.events.get().detail.lower()


def test_bounce_of_another_recipient_of_the_same_mail_leaves_ours_alone(stub: SnsStub, signing: Any) -> None:
    d = make_delivery(address="kept@example.com")
    event = ses_event(
        "Bounce",
        d.provider_message_id,
        bounce={"bounceType": "Permanent", "bouncedRecipients": [{"emailAddress": "other@example.com"}]},
    )
    before = snapshot(d)
    assert post(notification(event, stub, signing[0])).status_code == 200
    assert snapshot(d) == before


def test_transient_bounce_records_an_event_only(stub: SnsStub, signing: Any) -> None:
    d = make_delivery()
    event = ses_event(
        "Bounce",
        d.provider_message_id,
        bounce={"bounceType": "Transient", "bounceSubType": "MailboxFull", "bouncedRecipients": []},
    )
    assert post(notification(event, stub, signing[0])).status_code == 200
    d.refresh_from_db()
    assert d.status == "sent"
    events = list(d.events.values_list("status", "detail"))
    assert len(events) == 1 and events[0][0] == "sent" and "Transient/MailboxFull" in events[0][1]
    assert not Suppression.objects.exists()


def test_complaint_records_an_event_and_suppresses(stub: SnsStub, signing: Any) -> None:
    d = make_delivery(status="delivered", address="angry@example.com")
    event = ses_event(
        "Complaint",
        d.provider_message_id,
        complaint={"complaintFeedbackType": "abuse", "complainedRecipients": [{"emailAddress": "angry@example.com"}]},
    )
    assert post(notification(event, stub, signing[0])).status_code == 200
    d.refresh_from_db()
    assert d.status == "delivered"
    assert [e[1].split(" ")[0] for e in d.events.values_list("status", "detail")] == ["ses:complaint"]
    assert Suppression.objects.get(channel="email", address="angry@example.com").source == "complaint"


def test_open_marks_opened_and_a_late_delivery_event_does_not_move_it_back(stub: SnsStub, signing: Any) -> None:
    d = make_delivery()
    assert post(notification(ses_event("Open", d.provider_message_id), stub, signing[0])).status_code == 200
    d.refresh_from_db()
    assert d.status == "opened"
    late = notification(ses_event("Delivery", d.provider_message_id), stub, signing[0])
    assert post(late).status_code == 200
    d.refresh_from_db()
    assert d.status == "opened"
    assert list(d.events.values_list("status", flat=True)) == ["opened"]


def test_event_for_another_provider_or_unknown_message_changes_nothing(stub: SnsStub, signing: Any) -> None:
    d = make_delivery(provider="smtp", provider_message_id="shared-id")
    before = snapshot(d)
    assert post(notification(ses_event("Delivery", "shared-id"), stub, signing[0])).status_code == 200
    assert post(notification(ses_event("Delivery", "nobody"), stub, signing[0])).status_code == 200
    assert snapshot(d) == before


def test_certificate_is_fetched_once_and_cached(stub: SnsStub, signing: Any) -> None:
    d1, d2 = make_delivery(), make_delivery()
    assert post(notification(ses_event("Delivery", d1.provider_message_id), stub, signing[0])).status_code == 200
    assert post(notification(ses_event("Delivery", d2.provider_message_id), stub, signing[0])).status_code == 200
    assert stub.hits == ["/SimpleNotificationService-test.pem"]


def test_flood_of_new_certificate_urls_costs_no_fetch_beyond_the_budget(
    stub: SnsStub, signing: Any, settings: Any
) -> None:
    """Forged messages naming ever new certificate URLs on an allowed host: at most the budget is fetched."""
    settings.SNS_CERT_FETCHES_PER_MINUTE = 3
    genuine = make_delivery()
    # The real certificate is cached before the flood, so genuine messages keep verifying during it.
    assert (
        post(notification(ses_event("Delivery", make_delivery().provider_message_id), stub, signing[0])).status_code
        == 200
    )
    forger, _ = make_cert()
    before = snapshot(genuine)
    for n in range(40):
        message = notification(
            ses_event("Delivery", genuine.provider_message_id), stub, forger, cert_url=stub.url(f"/forged-{n}.pem")
        )
        assert post(message).status_code == 403
    assert snapshot(genuine) == before
    forged_hits = [h for h in stub.hits if h.startswith("/forged-")]
    assert len(forged_hits) == 2  # the budget of 3, less the genuine certificate's fetch
    assert stub.hits.count("/SimpleNotificationService-test.pem") == 1
    assert post(notification(ses_event("Delivery", genuine.provider_message_id), stub, signing[0])).status_code == 200
    genuine.refresh_from_db()
    assert genuine.status == "delivered"


def test_a_failing_certificate_url_is_fetched_once_while_remembered(stub: SnsStub, signing: Any) -> None:
    d = make_delivery()
    cert_url = stub.url("/not-a-certificate.pem")
    for _ in range(5):
        message = notification(ses_event("Delivery", d.provider_message_id), stub, signing[0], cert_url=cert_url)
        _assert_rejected(message, d)
    assert stub.hits == ["/not-a-certificate.pem"]


def test_a_cached_certificate_is_fetched_again_after_its_expiry(stub: SnsStub, signing: Any, settings: Any) -> None:
    settings.SNS_CERT_CACHE_SECONDS = 0.2
    assert (
        post(notification(ses_event("Delivery", make_delivery().provider_message_id), stub, signing[0])).status_code
        == 200
    )
    time.sleep(0.3)
    assert (
        post(notification(ses_event("Delivery", make_delivery().provider_message_id), stub, signing[0])).status_code
        == 200
    )
    assert stub.hits == ["/SimpleNotificationService-test.pem"] * 2


def test_certificate_cache_is_bounded(signing: Any) -> None:
    cache = verify._CertCache(max_entries=3)
    key = signing[0].public_key()
    for n in range(10):
        cache.put(f"https://sns.us-east-1.amazonaws.com/{n}.pem", key, 60)
    assert len(cache) == 3
    assert cache.get("https://sns.us-east-1.amazonaws.com/9.pem") is key
    assert cache.get("https://sns.us-east-1.amazonaws.com/0.pem") is None


def test_fetch_budget_refills_with_time() -> None:
    budget = verify._FetchBudget()
    assert all(budget.take(60) for _ in range(60))
    assert budget.take(60) is False
    time.sleep(1.2)  # 60 a minute is one a second: one fetch is earned back
    assert budget.take(60) is True


# --- replays -----------------------------------------------------------------------------------------


def test_replayed_message_is_rejected_and_changes_nothing(stub: SnsStub, signing: Any) -> None:
    d = make_delivery()
    message = notification(ses_event("Delivery", d.provider_message_id), stub, signing[0])
    assert post(message).status_code == 200
    before = snapshot(d)
    resp = post(message)
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "replayed_callback"
    assert snapshot(d) == before


def test_replay_after_redis_forgot_still_changes_nothing(stub: SnsStub, signing: Any) -> None:
    """The database is the backstop: forward-only transitions and once-per-message events."""
    d = make_delivery(address="angry@example.com")
    complaint = ses_event(
        "Complaint", d.provider_message_id, complaint={"complainedRecipients": [{"emailAddress": "angry@example.com"}]}
    )
    messages = [
        notification(ses_event("Delivery", d.provider_message_id), stub, signing[0]),
        notification(complaint, stub, signing[0]),
    ]
    for message in messages:
        assert post(message).status_code == 200
    before = snapshot(d)
    assert before[0] == "delivered" and len(before[1]) == 2 and before[2] == 1
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(f"{settings.REDIS_KEY_PREFIX}cb:*"):
        client.delete(key)
    for message in messages:
        assert post(message).status_code == 200
    assert snapshot(d) == before


# --- rejected messages: 403 (or 400 when unreadable), and nothing changes --------------------------------


def _assert_rejected(message: Any, d: Delivery, status: int = 403) -> dict[str, Any]:
    before = snapshot(d)
    resp = post(message)
    assert resp.status_code == status, resp.content
    assert snapshot(d) == before
    return resp.json()["error"]


def test_forged_signature_is_rejected(stub: SnsStub, signing: Any) -> None:
    d = make_delivery()
    other_key, _ = make_cert()
    forged = notification(ses_event("Delivery", d.provider_message_id), stub, other_key)
    assert _assert_rejected(forged, d)["code"] == "invalid_signature"


@pytest.mark.parametrize("version", ["1", "2"])
def test_tampered_message_is_rejected(stub: SnsStub, signing: Any, version: str) -> None:
    d = make_delivery()
    genuine = notification(ses_event("Delivery", "some-other-message"), stub, signing[0], version=version)
    genuine["Message"] = json.dumps(ses_event("Delivery", d.provider_message_id))
    _assert_rejected(genuine, d)


def test_signature_version_swap_is_rejected(stub: SnsStub, signing: Any) -> None:
    d = make_delivery()
    message = notification(ses_event("Delivery", d.provider_message_id), stub, signing[0], version="1")
    message["SignatureVersion"] = "2"
    _assert_rejected(message, d)


@pytest.mark.parametrize("change", ["drop", "empty", "garbage", "version3"])
def test_unsigned_or_badly_signed_is_rejected(stub: SnsStub, signing: Any, change: str) -> None:
    d = make_delivery()
    message = notification(ses_event("Delivery", d.provider_message_id), stub, signing[0])
    if change == "drop":
        del message["Signature"]
    elif change == "empty":
        message["Signature"] = ""
    elif change == "garbage":
        message["Signature"] = "not base64 at all!"
    else:
        message["SignatureVersion"] = "3"
    _assert_rejected(message, d)


def test_wrong_topic_is_rejected_before_any_fetch(stub: SnsStub, signing: Any) -> None:
    d = make_delivery()
    message = notification(
        ses_event("Delivery", d.provider_message_id), stub, signing[0], topic="arn:aws:sns:us-east-1:666:evil"
    )
    _assert_rejected(message, d)
    assert stub.hits == []


def test_stale_message_is_rejected(stub: SnsStub, signing: Any) -> None:
    d = make_delivery()
    old = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1, minutes=1)
    _assert_rejected(notification(ses_event("Delivery", d.provider_message_id), stub, signing[0], at=old), d)


def test_message_just_inside_the_window_is_accepted(stub: SnsStub, signing: Any) -> None:
    d = make_delivery()
    recent = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=55)
    message = notification(ses_event("Delivery", d.provider_message_id), stub, signing[0], at=recent)
    assert post(message).status_code == 200


def test_certificate_on_a_disallowed_host_is_never_fetched(stub: SnsStub, signing: Any) -> None:
    d = make_delivery()
    # Loopback, and serving the right certificate, but "localhost" is not on the allow-list.
    cert_url = stub.url("/SimpleNotificationService-test.pem", host="localhost")
    message = notification(ses_event("Delivery", d.provider_message_id), stub, signing[0], cert_url=cert_url)
    _assert_rejected(message, d)
    assert stub.hits == []


def test_plain_http_certificate_is_refused_unless_allowed(stub: SnsStub, signing: Any, settings: Any) -> None:
    settings.SNS_CERT_URL_ALLOW_HTTP = False
    d = make_delivery()
    _assert_rejected(notification(ses_event("Delivery", d.provider_message_id), stub, signing[0]), d)
    assert stub.hits == []


@pytest.mark.parametrize(
    "body",
    ["not json", "[1, 2]", json.dumps({"MessageId": "x"}), json.dumps({"Type": "Gossip", "Signature": "x"})],
)
def test_unreadable_body_is_a_400(stub: SnsStub, body: str) -> None:
    d = make_delivery()
    assert _assert_rejected(body, d, status=400)["code"] == "malformed_callback"


def test_signed_message_that_is_not_an_ses_event_is_a_400(stub: SnsStub, signing: Any) -> None:
    d = make_delivery()
    message = notification({"hello": "world"}, stub, signing[0])
    _assert_rejected(message, d, status=400)


# --- subscription confirmation ----------------------------------------------------------------------


def subscription_confirmation(stub: SnsStub, key: rsa.RSAPrivateKey, subscribe_url: str) -> dict[str, Any]:
    message = {
        "Type": "SubscriptionConfirmation",
        "MessageId": str(uuid.uuid4()),
        "Token": "2336412f37fb687f5d51e6e2425",
        "TopicArn": TOPIC_ARN,
        "Message": f"You have chosen to subscribe to the topic {TOPIC_ARN}.",
        "SubscribeURL": subscribe_url,
        "Timestamp": sns_timestamp(),
        "SigningCertURL": stub.url("/SimpleNotificationService-test.pem"),
    }
    return sign(message, key, "2")


def test_subscription_confirmation_visits_the_subscribe_url(stub: SnsStub, signing: Any) -> None:
    url = stub.url("/?Action=ConfirmSubscription&TopicArn=t&Token=2336412f37fb687f5d51e6e2425")
    resp = post(subscription_confirmation(stub, signing[0], url))
    assert resp.status_code == 200, resp.content
    assert stub.hits == [
        "/SimpleNotificationService-test.pem",
        "/?Action=ConfirmSubscription&TopicArn=t&Token=2336412f37fb687f5d51e6e2425",
    ]


def test_subscription_confirmation_on_a_disallowed_host_is_not_visited(stub: SnsStub, signing: Any) -> None:
    url = stub.url("/?Action=ConfirmSubscription&Token=x", host="localhost")
    resp = post(subscription_confirmation(stub, signing[0], url))
    assert resp.status_code == 403
    assert all("ConfirmSubscription" not in hit for hit in stub.hits)


def test_forged_subscription_confirmation_is_not_visited(stub: SnsStub, signing: Any) -> None:
    other_key, _ = make_cert()
    url = stub.url("/?Action=ConfirmSubscription&Token=x")
    assert post(subscription_confirmation(stub, other_key, url)).status_code == 403
    assert all("ConfirmSubscription" not in hit for hit in stub.hits)


# --- the certificate URL rule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem", True),
        ("https://sns.eu-central-1.amazonaws.com/SimpleNotificationService-abc.pem", True),
        ("https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem", True),
        ("http://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem", False),
        ("https://sns.us-east-1.amazonaws.com.evil.example/x.pem", False),
        ("https://evil.example/sns.us-east-1.amazonaws.com/x.pem", False),
        ("https://sns.us-east-1.amazonaws.com@evil.example/x.pem", False),
        ("https://user@sns.us-east-1.amazonaws.com/x.pem", False),
        ("https://sns.us-east-1.amazonaws.com:8443/x.pem", False),
        ("https://s3.amazonaws.com/x.pem", False),
        ("https://xsns.us-east-1.amazonaws.com/x.pem", False),
        ("ftp://sns.us-east-1.amazonaws.com/x.pem", False),
        ("https://127.0.0.1/x.pem", False),
        ("not a url", False),
    ],
)
def test_cert_url_rule_without_test_hosts(url: str, allowed: bool, settings: Any) -> None:
    settings.SNS_CERT_URL_ALLOWED_HOSTS = []
    settings.SNS_CERT_URL_ALLOW_HTTP = False
    assert verify.is_allowed_sns_url(url) is allowed


def test_with_redis_unreachable_callbacks_still_apply_and_replays_stay_harmless(
    stub: SnsStub, signing: Any, settings: Any
) -> None:
    """Redis is only the fast path: with it down (nothing listens on port 1), the database guards replays."""
    from core.redis_guard import get_redis

    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    get_redis.cache_clear()
    try:
        d = make_delivery(address="angry@example.com")
        complaint = ses_event(
            "Complaint",
            d.provider_message_id,
            complaint={"complainedRecipients": [{"emailAddress": "angry@example.com"}]},
        )
        messages = [
            notification(ses_event("Delivery", d.provider_message_id), stub, signing[0]),
            notification(complaint, stub, signing[0]),
        ]
        for message in messages:
            assert post(message).status_code == 200
        before = snapshot(d)
        assert before[0] == "delivered" and len(before[1]) == 2 and before[2] == 1
        for message in messages:
            assert post(message).status_code == 200
        assert snapshot(d) == before
    finally:
        get_redis.cache_clear()
