"""FCM push provider (firebase-admin, FCM HTTP v1).

One firebase app and one messaging service per worker process: its authorised session pools connections
and caches the OAuth token for its lifetime. The SDK hard-codes fcm.googleapis.com and retries 500/503
(and re-sends after a read timeout) with sleeps inside the call; we subclass its messaging service to
point it at `FCM_ENDPOINT` and to turn those retries off, because the pipeline owns retries (backoff,
shared rate limit, circuit breaker) and a silent re-send after a read timeout could duplicate a push.
Written against firebase-admin 7.7: `_MessagingService` is private, so an upgrade must re-run these tests.
"""

from __future__ import annotations

import itertools
import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import firebase_admin
import requests
from django.conf import settings
from firebase_admin import credentials, messaging
from firebase_admin import exceptions as fb
from firebase_admin.messaging import _MessagingService
from google.auth.exceptions import GoogleAuthError
from requests.adapters import HTTPAdapter

from channels_app.providers.base import (
    ConfigurationError,
    OutboundMessage,
    Outcome,
    PermanentError,
    Provider,
    ProviderError,
    RetriableError,
    SendResult,
    parse_retry_after,
)

FCM_MAX_BATCH = 500
# firebase-admin 7.7 deprecates Message.token in favour of Message.fid (Firebase installation ids), but our
# devices register FCM registration tokens, which FCM v1's `token` field still takes.
warnings.filterwarnings("ignore", message="Message.token is deprecated", category=DeprecationWarning)
_app_counter = itertools.count(1)


class _MessagingClient(_MessagingService):  # type: ignore[misc]  # firebase_admin ships no annotations
    """The SDK's messaging service with a configurable endpoint and without transport-level retries."""

    def __init__(self, app: firebase_admin.App, *, endpoint: str, pool_size: int) -> None:
        super().__init__(app)
        self._fcm_url = f"{endpoint.rstrip('/')}/v1/projects/{self._project_id}/messages:send"
        adapter = HTTPAdapter(pool_connections=pool_size, pool_maxsize=pool_size, max_retries=0)
        session = self._client.session
        # Replace every mounted adapter (including the SDK's retrying one for fcm.googleapis.com).
        for prefix in [*session.adapters, "http://", "https://"]:
            session.mount(prefix, adapter)
        session.trust_env = False


def _fcm_code(exc: fb.FirebaseError) -> str:
    """Return FCM's own error code (UNREGISTERED, QUOTA_EXCEEDED, ...) or the platform code."""
    response = getattr(exc, "http_response", None)
    if response is not None:
        try:
            for detail in response.json().get("error", {}).get("details", []):
                if detail.get("errorCode"):
                    return str(detail["errorCode"])
        except (ValueError, AttributeError):
            pass
    return str(exc.code or "UNKNOWN")


def _retry_after(exc: fb.FirebaseError) -> float | None:
    response = getattr(exc, "http_response", None)
    return parse_retry_after(response.headers.get("Retry-After")) if response is not None else None


# FCM codes about the token itself: the pipeline deactivates the device and suppresses the token.
SUPPRESS_CODES = {"UNREGISTERED", "SENDER_ID_MISMATCH", "INVALID_ARGUMENT"}
RETRIABLE_CODES = {"UNAVAILABLE", "INTERNAL", "UNKNOWN", "DEADLINE_EXCEEDED", "ABORTED", "CANCELLED"}
# The account or APNs/Web Push credentials are wrong: not this message's fault, fixable by an operator.
CONFIG_CODES = {"THIRD_PARTY_AUTH_ERROR", "UNAUTHENTICATED", "PERMISSION_DENIED"}


def classify(exc: fb.FirebaseError) -> ProviderError:
    """Sort a firebase-admin error into permanent or retriable."""
    code = _fcm_code(exc)
    text = f"fcm error {code}"
    if code == "QUOTA_EXCEEDED" or code == "RESOURCE_EXHAUSTED":
        return RetriableError(text, code=code, retry_after=_retry_after(exc), throttled=True)
    if code in SUPPRESS_CODES:
        return PermanentError(text, code=code, suppress=True)
    if isinstance(exc, fb.DeadlineExceededError) or code == "DEADLINE_EXCEEDED":
        cause = exc.cause
        read_timeout = isinstance(cause, requests.exceptions.ReadTimeout)
        return RetriableError(text, code="DEADLINE_EXCEEDED", maybe_sent=read_timeout)
    if code in RETRIABLE_CODES or code in CONFIG_CODES:
        return RetriableError(text, code=code, retry_after=_retry_after(exc))
    return PermanentError(text, code=code)


class FcmProvider(Provider):
    """Send push notifications through FCM."""

    name: ClassVar[str] = "fcm"
    channels: ClassVar[tuple[str, ...]] = ("push",)

    def __init__(
        self,
        *,
        service_account: dict[str, Any],
        project_id: str = "",
        endpoint: str = "https://fcm.googleapis.com",
        token_uri: str = "",
        timeout: float = 10.0,
        batch_size: int = FCM_MAX_BATCH,
        pool_size: int = 100,
    ) -> None:
        info = dict(service_account)
        if token_uri:
            info["token_uri"] = token_uri
        try:
            credential = credentials.Certificate(info)
        except ValueError as exc:
            raise ConfigurationError(f"FCM_CREDENTIALS_FILE is not a valid service account: {exc}") from None
        options: dict[str, Any] = {"httpTimeout": timeout}
        if project_id:
            options["projectId"] = project_id
        # A private app per provider instance, so nothing else in the process shares or replaces it.
        self.app = firebase_admin.initialize_app(credential, options, name=f"notifier-fcm-{next(_app_counter)}")
        self.service = _MessagingClient(self.app, endpoint=endpoint, pool_size=pool_size)
        self.batch_size = max(1, min(FCM_MAX_BATCH, batch_size))

    @classmethod
    def from_settings(cls) -> FcmProvider:
        """Build the provider from FCM_* settings; name the first missing variable."""
        path = settings.FCM_CREDENTIALS_FILE
        if not path:
            raise ConfigurationError("FCM_CREDENTIALS_FILE is not set (path to the Firebase service-account JSON)")
        try:
            info = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"FCM_CREDENTIALS_FILE cannot be read as JSON: {type(exc).__name__}") from None
        return cls(
            service_account=info,
            project_id=settings.FCM_PROJECT_ID,
            endpoint=settings.FCM_ENDPOINT,
            token_uri=settings.FCM_TOKEN_URI,
            timeout=settings.FCM_TIMEOUT_SECONDS,
            batch_size=settings.FCM_BATCH_SIZE,
        )

    def close(self) -> None:
        """Release the firebase app (tests create many providers in one process)."""
        firebase_admin.delete_app(self.app)

    @staticmethod
    def build(message: OutboundMessage) -> messaging.Message:
        """Build the FCM message for one device token."""
        content = message.content
        data = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in (content.get("data") or {}).items()}
        high = message.priority == "high"
        notification = None
        if content.get("title") or content.get("body"):
            notification = messaging.Notification(title=content.get("title") or None, body=content.get("body") or None)
        return messaging.Message(
            token=message.address,
            notification=notification,
            data=data or None,
            android=messaging.AndroidConfig(priority="high" if high else "normal"),
            apns=messaging.APNSConfig(headers={"apns-priority": "10" if high else "5"}),
        )

    def send(self, message: OutboundMessage) -> SendResult:
        """Send to one device and return FCM's message name."""
        try:
            built = self.build(message)
            _MessagingService.encode_message(built)
        except (ValueError, TypeError) as exc:
            raise PermanentError(f"invalid push message: {exc}", code="invalid_message") from None
        try:
            return SendResult(provider_message_id=self.service.send(built))
        except fb.FirebaseError as exc:
            raise classify(exc) from None
        except GoogleAuthError as exc:
            raise RetriableError(f"fcm token refresh failed: {type(exc).__name__}", code="auth") from None

    def send_batch(self, messages: Sequence[OutboundMessage]) -> list[Outcome]:
        """Send with the SDK's send_each in chunks of up to 500, one outcome per token."""
        outcomes: list[Outcome | None] = [None] * len(messages)
        ready: list[tuple[int, messaging.Message]] = []
        for index, message in enumerate(messages):
            try:
                built = self.build(message)
                _MessagingService.encode_message(built)
                ready.append((index, built))
            except (ValueError, TypeError) as exc:
                # One malformed message must not fail its 499 neighbours (send_each validates all first).
                outcomes[index] = PermanentError(f"invalid push message: {exc}", code="invalid_message")
        for start in range(0, len(ready), self.batch_size):
            chunk = ready[start : start + self.batch_size]
            for (index, _), outcome in zip(chunk, self._send_chunk([m for _, m in chunk]), strict=True):
                outcomes[index] = outcome
        return [o for o in outcomes if o is not None]

    def _send_chunk(self, chunk: list[messaging.Message]) -> list[Outcome]:
        try:
            batch = self.service.send_each(chunk)
        except fb.FirebaseError as exc:
            # send_each wraps anything outside a single call (a failed token refresh) for the whole chunk.
            text = f"fcm batch failed: {type(exc.cause or exc).__name__}"
            return [RetriableError(text, code="batch_error") for _ in chunk]
        results: list[Outcome] = []
        for response in batch.responses:
            if response.success:
                results.append(SendResult(provider_message_id=str(response.message_id)))
            else:
                results.append(classify(response.exception))
        return results
