"""Webhook provider: POST the rendered JSON to the recipient's URL, signed per Standard Webhooks.

The URL comes from an API caller, so every request goes through the SSRF guard (core.ssrf):
resolve, refuse internal addresses, pin the checked IP. Redirects are never followed (a 302 to an internal
address would walk around the guard). The signature is our own implementation of the Standard Webhooks
spec (https://www.standardwebhooks.com/); tests verify it with the independent `standardwebhooks` package.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import requests
from django.conf import settings
from requests_hardened import Config, HTTPSession

from channels_app.providers.base import (
    ConfigurationError,
    OutboundMessage,
    PermanentError,
    Provider,
    RetriableError,
    SendResult,
    parse_retry_after,
)
from channels_app.providers.deadline import CallDeadline, DeadlinePools, request_failure
from core import webhook_secrets
from core.ssrf import GuardedAdapter, UnsafeTargetError

SECRET_PREFIX = webhook_secrets.SECRET_PREFIX


def decode_secret(secret: str) -> bytes:
    """Return the raw key of a "whsec_<base64>" secret; a configuration error (permanent) if it is not one."""
    try:
        return webhook_secrets.decode_secret(secret)
    except ValueError as exc:
        raise ConfigurationError("webhook secret is not whsec_<base64>") from exc


def sign(*, secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """Return the `webhook-signature` header value ("v1,<base64 HMAC-SHA256>") for one message."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(decode_secret(secret), signed, hashlib.sha256).digest()
    return f"v1,{base64.b64encode(digest).decode()}"


class _DeadlineAdapter(DeadlinePools, GuardedAdapter):
    """The SSRF-guarded adapter whose connections a CallDeadline can abort (a dripped answer is bounded)."""


class WebhookProvider(Provider):
    """Deliver to HTTP(S) endpoints with Standard Webhooks signatures and an SSRF guard."""

    name: ClassVar[str] = "webhook"
    channels: ClassVar[tuple[str, ...]] = ("webhook",)

    def __init__(
        self,
        *,
        signing_secret: str = "",
        allow_private: bool = False,
        connect_timeout: float = 3.0,
        read_timeout: float = 10.0,
        user_agent: str = "Notifier-Webhooks/1.0",
        max_response_bytes: int = 65536,
        pool_size: int = 16,
    ) -> None:
        if signing_secret:
            decode_secret(signing_secret)  # fail at start-up, not on the first send
        self.signing_secret = signing_secret
        self.timeout = (connect_timeout, read_timeout)
        self.max_response_bytes = max_response_bytes
        self.max_concurrency = pool_size
        self.session = HTTPSession(
            Config(
                ip_filter_enable=False,  # our GuardedAdapter below does the filtering, with our policy
                ip_filter_allow_loopback_ips=False,
                never_redirect=True,
                default_timeout=self.timeout,
                user_agent_override=user_agent,
            )
        )
        # A proxy from the environment would make the pinned address meaningless.
        self.session.trust_env = False
        self.session.mount(
            "http://", _DeadlineAdapter(https=False, allow_private=allow_private, pool_maxsize=pool_size)
        )
        self.session.mount(
            "https://", _DeadlineAdapter(https=True, allow_private=allow_private, pool_maxsize=pool_size)
        )

    @classmethod
    def from_settings(cls) -> WebhookProvider:
        """Build the provider from WEBHOOK_* settings."""
        return cls(
            signing_secret=settings.WEBHOOK_SIGNING_SECRET,
            allow_private=settings.WEBHOOK_ALLOW_PRIVATE_TARGETS,
            connect_timeout=settings.WEBHOOK_CONNECT_TIMEOUT_SECONDS,
            read_timeout=settings.WEBHOOK_READ_TIMEOUT_SECONDS,
            user_agent=settings.WEBHOOK_USER_AGENT,
            max_response_bytes=settings.WEBHOOK_MAX_RESPONSE_BYTES,
            pool_size=settings.PROVIDER_CONCURRENCY,
        )

    def build_request(self, message: OutboundMessage, *, timestamp: int | None = None) -> tuple[bytes, dict[str, str]]:
        """Return the body and headers of the signed request for `message`."""
        secret = message.meta.get("webhook_secret") or self.signing_secret
        if not secret:
            raise PermanentError("no webhook signing secret for this endpoint", code="no_secret")
        payload: Any = message.content.get("body", {})
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        ts = int(time.time()) if timestamp is None else timestamp
        headers = {
            "Content-Type": "application/json",
            "webhook-id": message.idempotency_key,
            "webhook-timestamp": str(ts),
            "webhook-signature": sign(secret=secret, msg_id=message.idempotency_key, timestamp=ts, body=body),
        }
        return body, headers

    def send(self, message: OutboundMessage) -> SendResult:
        """POST the signed payload; sort the answer into success, permanent or retriable."""
        url = message.address
        if not url.lower().startswith(("http://", "https://")):
            raise PermanentError("webhook URL must be http(s)", code="bad_url")
        body, headers = self.build_request(message)
        response, _ = self.post_bounded(url, body, headers)
        return self._outcome(response.status_code, response.headers, message)

    def post_bounded(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[requests.Response, bytes]:
        """POST through the SSRF guard within the call deadline; return the response and its first bytes.

        The guarded, bounded HTTP path every outgoing call to a caller-chosen URL takes (webhooks, Teams and
        Discord incoming webhooks). Transport errors are sorted into ProviderErrors.
        """
        kept = bytearray()
        with CallDeadline(self.call_deadline) as call:
            response = self._post(url, body, headers, call)
            try:
                # Drain a bounded body so the connection goes back to the pool (keep-alive); a bigger body is
                # cut off and its connection dropped rather than read into memory. The answer is the status:
                # a body dripped past the deadline is cut off by it (the connection is not reused).
                for chunk in response.iter_content(8192):
                    kept += chunk
                    if len(kept) > self.max_response_bytes:
                        break
            except (requests.exceptions.RequestException, OSError):
                pass
            finally:
                response.close()
        return response, bytes(kept[: self.max_response_bytes])

    def _post(self, url: str, body: bytes, headers: dict[str, str], call: CallDeadline) -> requests.Response:
        """POST and return the response once its headers are in; sort transport errors."""
        try:
            response: requests.Response = self.session.post(
                url, data=body, headers=headers, timeout=self.timeout, stream=True
            )
            return response
        except UnsafeTargetError as exc:
            raise PermanentError(str(exc), code="unsafe_target") from None
        except (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema, ValueError):
            raise PermanentError("invalid webhook URL", code="bad_url") from None
        except requests.exceptions.RequestException as exc:
            # The receiver may have the request after a read timeout: webhook-id lets it deduplicate.
            failure = request_failure(exc, call)
            if failure is None:
                raise
            raise failure from None

    def _outcome(self, status: int, headers: Mapping[str, str], message: OutboundMessage) -> SendResult:
        code = f"http_{status}"
        if 200 <= status < 300:
            return SendResult(provider_message_id=message.idempotency_key)
        if status == 410:
            # Gone: the receiver asks us to stop; the pipeline disables this URL.
            raise PermanentError("endpoint gone", code=code, suppress=True)
        if status == 429:
            raise RetriableError(
                "rate limited", code=code, retry_after=parse_retry_after(headers.get("Retry-After")), throttled=True
            )
        if status >= 500 or status == 408:
            raise RetriableError("receiver error", code=code, retry_after=parse_retry_after(headers.get("Retry-After")))
        if 300 <= status < 400:
            raise PermanentError("redirect not followed", code=code)
        raise PermanentError("rejected by receiver", code=code)
