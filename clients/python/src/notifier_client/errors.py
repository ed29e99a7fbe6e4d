"""Errors raised by the client: one class per kind of answer, all carrying `.status`, `.code` and `.fields`."""

from __future__ import annotations

from typing import Any


class NotifierError(Exception):
    """Any error answered by Notifier (or no answer at all: `status` is None for connection failures)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str = "",
        fields: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.fields: dict[str, Any] = fields or {}
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, message={self.message!r})"


class BadRequestError(NotifierError):
    """400: invalid input; `fields` names each wrong field with its reasons."""


class AuthenticationError(NotifierError):
    """401: no API key, or not a valid one."""


class PermissionDeniedError(NotifierError):
    """403: a category, priority or scope this API client may not use."""


class NotFoundError(NotifierError):
    """404: no such object (or not one of this client's)."""


class ConflictError(NotifierError):
    """409: the dedup_key was used before with a different body."""


class RateLimitedError(NotifierError):
    """429: over the client's rate, or low-priority load shed; `retry_after` says when to come back."""


class ServerError(NotifierError):
    """5xx: Notifier or its database is unavailable."""


class NotifierConnectionError(NotifierError):
    """No answer: the connection failed or timed out (after the retries)."""


class WebhookVerificationError(Exception):
    """A status event whose signature, id or timestamp does not verify: do not trust its body."""


_BY_STATUS: dict[int, type[NotifierError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    429: RateLimitedError,
}


def error_for(status: int, body: Any, retry_after: float | None = None) -> NotifierError:
    """Return the error for an HTTP status and Notifier's error body `{"error": {"code", "message", "fields"}}`."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        error = {}
    cls = ServerError if status >= 500 else _BY_STATUS.get(status, NotifierError)
    message = str(error.get("message") or f"HTTP {status}")
    fields = error.get("fields") if isinstance(error.get("fields"), dict) else {}
    return cls(message, status=status, code=str(error.get("code") or ""), fields=fields, retry_after=retry_after)
