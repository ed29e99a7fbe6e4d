"""Verify status events on the receiving side: Standard Webhooks signatures, with the standard library only.

Notifier signs each event with the endpoint's secret (`whsec_<base64 key>`): the headers `webhook-id`,
`webhook-timestamp` (Unix seconds) and `webhook-signature` (`v1,<base64 HMAC-SHA256 of "id.timestamp.body">`,
several separated by spaces while a secret rotates).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from notifier_client.errors import WebhookVerificationError

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_SECONDS = 300


def _key(secret: str | bytes) -> bytes:
    if isinstance(secret, bytes):
        return secret
    encoded = secret[len(SECRET_PREFIX) :] if secret.startswith(SECRET_PREFIX) else secret
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the secret must be 'whsec_' followed by base64") from None


def sign(secret: str | bytes, *, msg_id: str, timestamp: int, body: bytes | str) -> str:
    """Return the `webhook-signature` value for a body (`v1,<base64>`)."""
    raw = body.encode() if isinstance(body, str) else body
    signed = f"{msg_id}.{timestamp}.".encode() + raw
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(
    body: bytes | str,
    headers: Mapping[str, str],
    secret: str | bytes,
    *,
    tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> Any:
    """Verify a received event and return its parsed JSON body; raise WebhookVerificationError otherwise.

    Pass the body exactly as received (bytes before any parsing) and the request headers (any case). Events
    older or newer than `tolerance_seconds` are refused, so a captured request cannot be replayed later.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp, signatures = (lower.get(h) for h in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not msg_id or not stamp or not signatures:
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature header")
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError("invalid webhook-timestamp") from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_seconds:
        raise WebhookVerificationError("webhook-timestamp is outside the tolerance")
    expected = sign(secret, msg_id=msg_id, timestamp=timestamp, body=body).encode()
    for candidate in signatures.split():
        version, _, _ = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(candidate.encode(), expected):
            raw = body.decode() if isinstance(body, bytes) else body
            try:
                return json.loads(raw) if raw else None
            except ValueError:
                raise WebhookVerificationError("the signed body is not JSON") from None
    raise WebhookVerificationError("no matching signature")
