"""Twilio SMS provider (the twilio SDK's Messages API).

The client is built once per worker process around one pooled `requests` session (keep-alive). SDK
retries are off: the pipeline owns retries, with backoff and a shared rate limit. `TWILIO_BASE_URL`
points the real SDK at a stand-in by rewriting the origin of each request it makes.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import requests
from django.conf import settings
from requests.adapters import HTTPAdapter
from twilio.base.exceptions import TwilioException, TwilioRestException
from twilio.http.http_client import TwilioHttpClient
from twilio.http.response import Response
from twilio.rest import Client

from channels_app.providers.base import (
    AccountOptions,
    ConfigurationError,
    OutboundMessage,
    PermanentError,
    Provider,
    RetriableError,
    SendResult,
    connection_not_made,
    parse_retry_after,
)

# Twilio error codes that say the message can never go to this number. Those about the number itself
# (not a mobile, unsubscribed, unreachable) also put it on the suppression list.
# https://www.twilio.com/docs/api/errors
SUPPRESS_CODES = {
    21211,  # invalid 'To' phone number
    21214,  # 'To' number cannot be reached
    21610,  # recipient replied STOP: unsubscribed
    21612,  # 'To' number not reachable via this channel (landline / carrier)
    21614,  # 'To' number is not a valid mobile number
    21217,  # phone number does not appear to be valid
}
PERMANENT_CODES = {
    21408,  # permission to send to this region not enabled
    21211,
    21214,
    21217,
    21601,  # phone number is not a valid SMS-capable number
    21602,  # message body required
    21604,  # 'To' required
    21606,  # 'From' not a valid SMS-capable number for this account
    21608,  # trial account: unverified number
    21610,
    21612,
    21614,
    21617,  # body exceeds the concatenated message limit
    21660,  # mismatch between From and account
    30003,  # unreachable destination handset
    30004,  # message blocked
    30005,  # unknown destination handset
    30006,  # landline or unreachable carrier
    30007,  # carrier violation (filtered)
}
THROTTLE_CODES = {20429, 14107, 30022, 63018}  # too many requests; SMS rate; account rate; WhatsApp rate
# WhatsApp (https://www.twilio.com/docs/whatsapp/api#error-codes): the number has no WhatsApp account or cannot be
# reached on it (suppressed), and messages WhatsApp refuses as they are (outside the 24-hour session without an
# approved template, a template or its variables refused, the sender not approved).
WHATSAPP_SUPPRESS_CODES = {63003, 63024}
WHATSAPP_PERMANENT_CODES = {63016, 63005, 63013, 63020, 63027, 63028, 63032, 63021, 63007, 21656}
# The SDK logs each request line, query and headers at INFO; keep numbers out of our logs.
_quiet_logger = logging.getLogger("notifier.providers.twilio.http")
_quiet_logger.setLevel(logging.WARNING)


class _HttpClient(TwilioHttpClient):  # type: ignore[misc]  # twilio ships no annotations: its base is Any
    """Twilio's HTTP client with a pooled session for http and https, no retries, and an origin override.

    The last response is kept per thread, so Retry-After is read from the answer to *this* call when a
    batch runs on several threads.
    """

    def __init__(self, *, base_url: str, timeout: float, pool_size: int) -> None:
        super().__init__(pool_connections=True, timeout=timeout, logger=_quiet_logger)
        adapter = HTTPAdapter(pool_connections=pool_size, pool_maxsize=pool_size, max_retries=0)
        assert self.session is not None
        self.session.mount("https://", adapter)
        self.session.mount("http://", adapter)
        self.session.trust_env = False
        self._origin = urlsplit(base_url) if base_url else None
        self._local = threading.local()

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Response:
        """Send through the pooled session, to the overridden origin when one is configured."""
        if self._origin is not None:
            parts = urlsplit(url)
            url = urlunsplit((self._origin.scheme, self._origin.netloc, parts.path, parts.query, parts.fragment))
        self._local.response = None
        response = super().request(method, url, *args, **kwargs)
        self._local.response = response
        return response

    @property
    def thread_response(self) -> Response | None:
        """Return the last response received on this thread."""
        return getattr(self._local, "response", None)


class TwilioProvider(Provider):
    """Send SMS with Twilio."""

    name: ClassVar[str] = "twilio"
    channels: ClassVar[tuple[str, ...]] = ("sms",)
    suppress_codes: ClassVar[frozenset[int]] = frozenset(SUPPRESS_CODES)
    permanent_codes: ClassVar[frozenset[int]] = frozenset(PERMANENT_CODES)
    account_keys: ClassVar[tuple[str, ...]] = (
        "account_sid",
        "auth_token",
        "api_key_sid",
        "api_key_secret",
        "messaging_service_sid",
        "from_number",
        "base_url",
        "status_callback_url",
        "timeout_seconds",
    )

    def __init__(
        self,
        *,
        account_sid: str,
        auth_token: str = "",
        api_key_sid: str = "",
        api_key_secret: str = "",
        from_number: str = "",
        messaging_service_sid: str = "",
        status_callback_url: str = "",
        base_url: str = "",
        timeout: float = 10.0,
        pool_size: int = 16,
    ) -> None:
        self.http = _HttpClient(base_url=base_url, timeout=timeout, pool_size=pool_size)
        if api_key_sid:
            self.client = Client(api_key_sid, api_key_secret, account_sid, http_client=self.http)
        else:
            self.client = Client(account_sid, auth_token, http_client=self.http)
        self.from_number = from_number
        self.messaging_service_sid = messaging_service_sid
        self.status_callback_url = status_callback_url
        self.max_concurrency = pool_size

    @classmethod
    def from_settings(cls) -> TwilioProvider:
        """Build the provider from TWILIO_* settings; name the first missing variable."""
        account = cls.account_settings()
        if not settings.TWILIO_MESSAGING_SERVICE_SID and not settings.TWILIO_FROM_NUMBER:
            raise ConfigurationError("TWILIO_MESSAGING_SERVICE_SID or TWILIO_FROM_NUMBER is not set")
        return cls(
            **account,
            from_number=settings.TWILIO_FROM_NUMBER,
            messaging_service_sid=settings.TWILIO_MESSAGING_SERVICE_SID,
        )

    @staticmethod
    def account_settings() -> dict[str, Any]:
        """Return the account's settings (credentials, endpoint, callbacks); name the first missing variable."""
        if not settings.TWILIO_ACCOUNT_SID:
            raise ConfigurationError("TWILIO_ACCOUNT_SID is not set")
        if not settings.TWILIO_AUTH_TOKEN and not (settings.TWILIO_API_KEY_SID and settings.TWILIO_API_KEY_SECRET):
            raise ConfigurationError("TWILIO_AUTH_TOKEN is not set (or TWILIO_API_KEY_SID and TWILIO_API_KEY_SECRET)")
        return {
            "account_sid": settings.TWILIO_ACCOUNT_SID,
            "auth_token": settings.TWILIO_AUTH_TOKEN,
            "api_key_sid": settings.TWILIO_API_KEY_SID,
            "api_key_secret": settings.TWILIO_API_KEY_SECRET,
            "status_callback_url": settings.TWILIO_STATUS_CALLBACK_URL,
            "base_url": settings.TWILIO_BASE_URL,
            "timeout": settings.TWILIO_TIMEOUT_SECONDS,
            "pool_size": settings.PROVIDER_CONCURRENCY,
        }

    @classmethod
    def from_account(cls, options: AccountOptions) -> TwilioProvider:
        """Build a named account's Twilio sender: its own account, credentials and sender, not the installation's."""
        account_sid = options.text("account_sid")
        if not account_sid:
            raise ConfigurationError("account_sid is not set")
        auth_token = options.text("auth_token")
        api_key_sid, api_key_secret = options.text("api_key_sid"), options.text("api_key_secret")
        if not auth_token and not (api_key_sid and api_key_secret):
            raise ConfigurationError("auth_token is not set (or api_key_sid and api_key_secret)")
        return cls(
            account_sid=account_sid,
            auth_token=auth_token,
            api_key_sid=api_key_sid,
            api_key_secret=api_key_secret,
            # No sender of its own: the project's SMS sender must name one (else Twilio refuses the message).
            from_number=options.text("from_number"),
            messaging_service_sid=options.text("messaging_service_sid"),
            status_callback_url=options.text("status_callback_url", settings.TWILIO_STATUS_CALLBACK_URL),
            base_url=options.text("base_url", settings.TWILIO_BASE_URL),
            timeout=options.number("timeout_seconds", settings.TWILIO_TIMEOUT_SECONDS),
            pool_size=settings.PROVIDER_CONCURRENCY,
        )

    def build_params(self, message: OutboundMessage) -> dict[str, Any]:
        """Return the Messages API parameters of an SMS: the number, the text, the sender."""
        params: dict[str, Any] = {"to": message.address, "body": message.content.get("text", "")}
        sender = message.meta.get("sms_from")
        if sender:
            params["from_"] = sender
        elif self.messaging_service_sid:
            params["messaging_service_sid"] = self.messaging_service_sid
        else:
            params["from_"] = self.from_number
        return params

    def send(self, message: OutboundMessage) -> SendResult:
        """Create the message at Twilio and return its SID."""
        params = self.build_params(message)
        if self.status_callback_url:
            params["status_callback"] = self.status_callback_url
        try:
            created = self.client.messages.create(**params)
        except TwilioRestException as exc:
            raise self._classify(exc) from None
        except requests.exceptions.ConnectTimeout:
            raise RetriableError("connect timeout", code="connect_timeout") from None
        except requests.exceptions.ReadTimeout:
            raise RetriableError("read timeout", code="read_timeout", maybe_sent=True) from None
        except requests.exceptions.ConnectionError as exc:
            # Refused before a byte left: another provider may take it. Aborted after the request was written:
            # Twilio may have created the message, so it is ambiguous (same provider only, never a failover).
            not_made = connection_not_made(exc)
            raise RetriableError(
                "connection refused" if not_made else "connection lost after the request was sent",
                code="connection_error",
                maybe_sent=not not_made,
            ) from None
        except TwilioException as exc:
            # The SDK's own errors (an unparsable answer): the request may have been handled.
            raise RetriableError(
                f"twilio client error: {type(exc).__name__}", code="client_error", maybe_sent=True
            ) from None
        return SendResult(provider_message_id=str(created.sid))

    def _classify(self, exc: TwilioRestException) -> Exception:
        status = int(exc.status or 0)
        code = int(exc.code) if exc.code else None
        label = str(code) if code else f"http_{status}"
        # The exception text holds the request URL and the error message, never the number; keep the code only.
        text = f"twilio error {label} (HTTP {status})"
        response = self.http.thread_response
        retry_after = parse_retry_after(response.headers.get("Retry-After")) if response is not None else None
        if status == 429 or code in THROTTLE_CODES:
            return RetriableError(text, code=label, retry_after=retry_after, throttled=True)
        if status >= 500:
            return RetriableError(text, code=label, retry_after=retry_after)
        if code in self.suppress_codes or code in self.permanent_codes:
            return PermanentError(text, code=label, suppress=code in self.suppress_codes)
        if status in (401, 403):
            # Credentials or account trouble: not this message's fault, and fixable by an operator.
            return RetriableError(text, code=label)
        return PermanentError(text, code=label)


class TwilioWhatsAppProvider(TwilioProvider):
    """Send WhatsApp messages through Twilio's Messages API (`whatsapp:` addresses).

    A message outside a 24-hour session must be an approved template: the chat part's `content_sid` with its
    `variables` (Twilio Content API); otherwise its `text` is sent as a session message.
    """

    name: ClassVar[str] = "twilio_whatsapp"
    channels: ClassVar[tuple[str, ...]] = ("whatsapp",)
    suppress_codes: ClassVar[frozenset[int]] = frozenset(WHATSAPP_SUPPRESS_CODES)
    permanent_codes: ClassVar[frozenset[int]] = frozenset(PERMANENT_CODES | WHATSAPP_PERMANENT_CODES)

    @classmethod
    def from_settings(cls) -> TwilioWhatsAppProvider:
        """Build the provider from the TWILIO_* account and the TWILIO_WHATSAPP_* sender."""
        account = cls.account_settings()
        if not settings.TWILIO_WHATSAPP_MESSAGING_SERVICE_SID and not settings.TWILIO_WHATSAPP_FROM:
            raise ConfigurationError("TWILIO_WHATSAPP_FROM or TWILIO_WHATSAPP_MESSAGING_SERVICE_SID is not set")
        return cls(
            **account,
            from_number=settings.TWILIO_WHATSAPP_FROM,
            messaging_service_sid=settings.TWILIO_WHATSAPP_MESSAGING_SERVICE_SID,
        )

    @classmethod
    def from_account(cls, options: AccountOptions) -> TwilioWhatsAppProvider:
        """Build a named account's WhatsApp sender: its own Twilio account and its own WhatsApp sender.

        A project has no WhatsApp sender setting of its own, so the account must name one.
        """
        if not options.text("messaging_service_sid") and not options.text("from_number"):
            raise ConfigurationError("from_number or messaging_service_sid is not set")
        provider = super().from_account(options)
        assert isinstance(provider, TwilioWhatsAppProvider)
        return provider

    def build_params(self, message: OutboundMessage) -> dict[str, Any]:
        """Return the parameters of a WhatsApp message: an approved template with variables, or the text."""
        content = message.content
        params: dict[str, Any] = {"to": f"whatsapp:{message.address}"}
        if self.messaging_service_sid:
            params["messaging_service_sid"] = self.messaging_service_sid
        else:
            params["from_"] = f"whatsapp:{self.from_number}"
        content_sid = str(content.get("content_sid") or "")
        if content_sid:
            params["content_sid"] = content_sid
            variables = content.get("variables") or {}
            if variables:
                params["content_variables"] = json.dumps(
                    {str(k): str(v) for k, v in variables.items()}, separators=(",", ":"), ensure_ascii=False
                )
        else:
            params["body"] = str(content.get("text") or "")
        return params
