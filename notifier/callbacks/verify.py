"""Signature checks of provider callbacks: Amazon SNS messages (SignatureVersion 1 and 2) and Twilio.

SNS: the signed string is built from the message's own fields in a fixed order
(https://docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message-verify-message-signature.html),
signed with the key of a certificate that SNS serves from `SigningCertURL`. Anyone can put any URL there,
so the URL is trusted only on an SNS host over https, fetched without redirects, with a timeout and a size
cap, cached per process (bounded, with expiry; failures too), and new URLs are fetched at a bounded rate.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import requests
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from twilio.request_validator import SIGNATURE_SETTINGS_HEADER, RequestValidator, get_signature_algorithm

from notifier.callbacks import conf

logger = logging.getLogger(__name__)

SNS_HOST_RE = re.compile(r"^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$")
MAX_CERT_BYTES = 64 * 1024

# Fields that go into the string to sign, in the order SNS uses; optional ones are skipped when absent.
_NOTIFICATION_FIELDS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
_SUBSCRIPTION_FIELDS = ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type")
_OPTIONAL_FIELDS = frozenset({"Subject"})
_HASHES: dict[str, type[hashes.HashAlgorithm]] = {"1": hashes.SHA1, "2": hashes.SHA256}

SNS_TYPES = frozenset({"Notification", "SubscriptionConfirmation", "UnsubscribeConfirmation"})


class VerificationError(Exception):
    """A callback failed verification (forged, unsigned, stale, from an untrusted source): answer 403."""


class MalformedCallback(Exception):
    """A callback cannot be read at all (not JSON, fields missing): answer 400."""


def is_allowed_sns_url(url: str) -> bool:
    """Return whether `url` may be fetched as an SNS certificate or subscribe URL.

    https on `sns.<region>.amazonaws.com`, or a host on the SNS_CERT_URL_ALLOWED_HOSTS list (a loopback
    stand-in in tests, over http only when SNS_CERT_URL_ALLOW_HTTP is on as well).
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    host = (parts.hostname or "").lower()
    if not host or parts.username is not None or parts.password is not None:
        return False
    allowed_schemes = {"https", "http"} if conf.sns_cert_url_allow_http() else {"https"}
    if parts.scheme not in allowed_schemes:
        return False
    extra = conf.sns_cert_url_allowed_hosts()
    if host in extra or (port is not None and f"{host}:{port}" in extra):
        return True
    return bool(SNS_HOST_RE.match(host)) and port in (None, 443) and parts.scheme == "https"


def _fetch_allowed(url: str) -> requests.Response:
    """GET an allowed SNS URL: no redirects (they could lead anywhere), a timeout, a streamed body."""
    if not is_allowed_sns_url(url):
        raise VerificationError("URL is not on an allowed SNS host")
    timeout = conf.sns_fetch_timeout_seconds()
    return requests.get(url, timeout=timeout, allow_redirects=False, stream=True)


class _CertCache:
    """Per-process cache of signing keys by certificate URL (SNS rotates certificates rarely).

    Bounded: at most `max_entries` keys (the oldest goes first), each until its expiry. A URL whose fetch
    failed is remembered as failed for a while too, so forged messages repeating it cost no new fetch.
    """

    def __init__(self, max_entries: int = 32) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, rsa.RSAPublicKey | None]] = {}
        self._max = max_entries

    def lookup(self, url: str) -> tuple[bool, rsa.RSAPublicKey | None]:
        """Return (known, key): known is False for a URL never seen or expired; key is None for a failed one."""
        with self._lock:
            entry = self._entries.get(url)
            if entry is None or entry[0] < time.monotonic():
                self._entries.pop(url, None)
                return False, None
            return True, entry[1]

    def get(self, url: str) -> rsa.RSAPublicKey | None:
        """Return the cached key of `url`, or None."""
        return self.lookup(url)[1]

    def put(self, url: str, key: rsa.RSAPublicKey | None, ttl: float) -> None:
        """Remember `url`'s key (None: its fetch failed) for `ttl` seconds."""
        with self._lock:
            self._entries.pop(url, None)
            if len(self._entries) >= self._max:
                now = time.monotonic()
                for stale in [u for u, (expiry, _) in self._entries.items() if expiry < now]:
                    del self._entries[stale]
            while len(self._entries) >= self._max:
                self._entries.pop(next(iter(self._entries)))
            self._entries[url] = (time.monotonic() + ttl, key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        """Forget every entry (tests)."""
        with self._lock:
            self._entries.clear()


class _FetchBudget:
    """Per-process token bucket bounding certificate fetches of URLs not in the cache.

    The certificate URL comes from an unauthenticated message, so without a bound every forged message
    naming a new URL would cost an outgoing request. Per process on purpose: a fetch is a local cost
    (a worker thread waiting on the network), and a shared bucket would let one flood starve every process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: float | None = None
        self._stamp = 0.0

    def take(self, per_minute: float) -> bool:
        """Spend one fetch if the budget allows it; return False when it is spent."""
        with self._lock:
            now = time.monotonic()
            if self._tokens is None:
                self._tokens = per_minute
            else:
                self._tokens = min(per_minute, self._tokens + (now - self._stamp) * per_minute / 60.0)
            self._stamp = now
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True

    def reset(self) -> None:
        """Refill the bucket (tests)."""
        with self._lock:
            self._tokens = None


cert_cache = _CertCache(max_entries=conf.sns_cert_cache_max_entries())
fetch_budget = _FetchBudget()


def _load_signing_key(url: str) -> rsa.RSAPublicKey:
    """Return the RSA public key of the certificate at `url`, fetched once and cached."""
    known, cached = cert_cache.lookup(url)
    if cached is not None:
        return cached
    if known:
        raise VerificationError("signing certificate fetch failed recently")
    if not fetch_budget.take(conf.sns_cert_fetches_per_minute()):
        logger.warning("SNS certificate fetch budget spent; message rejected unverified")
        raise VerificationError("signing certificate fetch budget spent")
    try:
        key = _fetch_signing_key(url)
    except VerificationError:
        cert_cache.put(url, None, conf.sns_cert_failure_cache_seconds())
        raise
    cert_cache.put(url, key, conf.sns_cert_cache_seconds())
    return key


def _fetch_signing_key(url: str) -> rsa.RSAPublicKey:
    """Fetch and check the certificate at `url`; return its RSA public key."""
    try:
        response = _fetch_allowed(url)
        with response:
            if response.status_code != 200:
                raise VerificationError(f"signing certificate fetch answered {response.status_code}")
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_content(chunk_size=8192):
                size += len(chunk)
                if size > MAX_CERT_BYTES:
                    raise VerificationError("signing certificate too large")
                chunks.append(chunk)
            body = b"".join(chunks)
    except requests.RequestException as exc:
        raise VerificationError(f"signing certificate fetch failed: {type(exc).__name__}") from exc
    try:
        cert = x509.load_pem_x509_certificate(body)
    except ValueError as exc:
        raise VerificationError("signing certificate is not a PEM certificate") from exc
    now = datetime.now(UTC)
    if not (cert.not_valid_before_utc <= now <= cert.not_valid_after_utc):
        raise VerificationError("signing certificate is not valid now")
    key = cert.public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise VerificationError("signing certificate does not hold an RSA key")
    return key


def sns_string_to_sign(message: Mapping[str, Any]) -> bytes:
    """Return the canonical string SNS signs for this message ("Name\\nvalue\\n" per field, in order)."""
    fields = _NOTIFICATION_FIELDS if message.get("Type") == "Notification" else _SUBSCRIPTION_FIELDS
    out: list[str] = []
    for name in fields:
        value = message.get(name)
        if value is None:
            if name in _OPTIONAL_FIELDS:
                continue
            raise MalformedCallback(f"missing field {name}")
        if not isinstance(value, str):
            raise MalformedCallback(f"field {name} is not a string")
        out.append(f"{name}\n{value}\n")
    return "".join(out).encode("utf-8")


def parse_sns_timestamp(value: Any) -> datetime:
    """Parse an SNS Timestamp (ISO 8601, UTC)."""
    if not isinstance(value, str):
        raise MalformedCallback("field Timestamp is not a string")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise MalformedCallback("field Timestamp is not ISO 8601") from exc
    if parsed.tzinfo is None:
        raise MalformedCallback("field Timestamp has no time zone")
    return parsed


def verify_sns_message(message: Mapping[str, Any], *, now: datetime | None = None) -> None:
    """Check that an SNS message is genuine, from an allowed topic, and recent; raise if it is not.

    Raises MalformedCallback for a message that cannot be checked at all, VerificationError otherwise.
    Cheap checks come first so junk never causes a certificate fetch.
    """
    if message.get("Type") not in SNS_TYPES:
        raise MalformedCallback("unknown or missing Type")
    signature_b64 = message.get("Signature")
    if not signature_b64:
        raise VerificationError("message is not signed")
    algorithm = _HASHES.get(str(message.get("SignatureVersion", "")))
    if algorithm is None:
        raise VerificationError("unsupported SignatureVersion")
    string_to_sign = sns_string_to_sign(message)
    if message.get("TopicArn") not in conf.ses_topic_arns():
        raise VerificationError("topic is not allowed")
    sent_at = parse_sns_timestamp(message.get("Timestamp"))
    now = now or datetime.now(UTC)
    age = (now - sent_at).total_seconds()
    # A little tolerance for clocks ahead of ours; the signature covers the timestamp, so only SNS sets it.
    if age > conf.sns_max_age_seconds() or age < -300:
        raise VerificationError("message timestamp is outside the replay window")
    cert_url = message.get("SigningCertURL") or message.get("SigningCertUrl")
    if not isinstance(cert_url, str) or not is_allowed_sns_url(cert_url):
        raise VerificationError("SigningCertURL is not on an allowed SNS host")
    try:
        signature = base64.b64decode(str(signature_b64), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise VerificationError("signature is not base64") from exc
    key = _load_signing_key(cert_url)
    try:
        key.verify(signature, string_to_sign, padding.PKCS1v15(), algorithm())
    except InvalidSignature as exc:
        raise VerificationError("signature does not match") from exc


def visit_subscribe_url(url: str) -> int:
    """Confirm an SNS subscription by visiting its SubscribeURL (only on an allowed SNS host)."""
    try:
        response = _fetch_allowed(url)
        with response:
            return response.status_code
    except requests.RequestException as exc:
        raise VerificationError(f"SubscribeURL visit failed: {type(exc).__name__}") from exc


def verify_twilio_preconditions(*, signature: str) -> None:
    """Refuse a Twilio callback that cannot verify before reading its body: no token configured, or unsigned."""
    if not conf.twilio_auth_tokens():
        raise VerificationError("TWILIO_AUTH_TOKEN is not configured")
    if not signature:
        raise VerificationError("request is not signed")


def verify_twilio_request(*, urls: Sequence[str], params: Any, signature: str, headers: Mapping[str, str]) -> None:
    """Check X-Twilio-Signature over the URL Twilio called and the form parameters; raise VerificationError if bad.

    `urls` are the public URLs this request may have been sent to (Twilio signs the exact URL it called).
    """
    verify_twilio_preconditions(signature=signature)
    algorithm = get_signature_algorithm(headers.get(SIGNATURE_SETTINGS_HEADER, ""))
    # The installation's account, then the projects' named Twilio accounts: whichever sent the message signs.
    validators = [RequestValidator(token) for token in conf.twilio_auth_tokens()]
    if not any(
        validator.validate(url, params, signature, algorithm=algorithm)
        for validator in validators
        for url in dict.fromkeys(urls)
    ):
        raise VerificationError("signature does not match")
