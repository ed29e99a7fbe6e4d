"""The one small interface every provider adapter implements.

An adapter turns an `OutboundMessage` (a rendered template and an address) into a provider call and either
returns the provider's message id or raises a `ProviderError` that says whether trying again can help.
After healthchecks' `hc/integrations/*/transport.py`: one adapter per provider, errors sorted at the edge.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar

from notifier import tracing


@dataclass(frozen=True)
class OutboundMessage:
    """A rendered message for one delivery, ready for a provider.

    `content` holds the channel's rendered parts: email {subject, text, html}; push {title, body, data};
    sms {text}; inapp {title, body}; webhook {body}. `idempotency_key` is stable across retries of the same
    delivery, for providers that deduplicate on it (the webhook-id header, the sandbox).
    """

    delivery_id: int
    channel: str
    address: str
    content: dict[str, Any]
    idempotency_key: str
    category: str = ""
    priority: str = "high"
    # Extra per-message data an adapter may need: list_unsubscribe URL, webhook secret, sender overrides.
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SendResult:
    """A provider accepted the message."""

    provider_message_id: str


class ProviderError(Exception):
    """A provider call failed. `retriable` says whether another attempt can succeed.

    `code` is the provider's own error code (kept for the delivery's last_error and for metrics);
    `retry_after` is the provider's hint in seconds (Retry-After), honoured by the backoff.
    `throttled` marks rate-limit responses (429 and the like), which also lower the shared rate.
    `suppress` asks the pipeline to put the address on the suppression list (invalid token, hard bounce,
    STOP): set on permanent errors that are about the address rather than the message.
    `maybe_sent` marks an error after the request may have reached the provider (a read timeout), so a
    failover to another provider must be a recorded decision, not a silent re-send.
    """

    def __init__(
        self,
        message: str,
        *,
        retriable: bool,
        code: str = "",
        retry_after: float | None = None,
        throttled: bool = False,
        suppress: bool = False,
        maybe_sent: bool = False,
    ) -> None:
        super().__init__(message)
        self.retriable = retriable
        self.code = code
        self.retry_after = retry_after
        self.throttled = throttled
        self.suppress = suppress
        self.maybe_sent = maybe_sent

    def __str__(self) -> str:
        text = super().__str__()
        return f"[{self.code}] {text}" if self.code else text


class PermanentError(ProviderError):
    """Another attempt cannot succeed: fail the delivery now."""

    def __init__(self, message: str, *, code: str = "", suppress: bool = False) -> None:
        super().__init__(message, retriable=False, code=code, suppress=suppress)


class RetriableError(ProviderError):
    """A transient failure (timeout, 5xx, throttling): try again later."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "",
        retry_after: float | None = None,
        throttled: bool = False,
        maybe_sent: bool = False,
    ) -> None:
        super().__init__(
            message, retriable=True, code=code, retry_after=retry_after, throttled=throttled, maybe_sent=maybe_sent
        )


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Turn a Retry-After header (seconds or an HTTP date) into seconds from now; None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class ConfigurationError(Exception):
    """A provider was switched on with settings missing or wrong; raised at start-up."""


Outcome = SendResult | ProviderError


class Provider:
    """Base class of every adapter. Subclasses set `name` and `channels` and implement `send`."""

    name: ClassVar[str] = ""
    channels: ClassVar[tuple[str, ...]] = ()
    # Calls in flight at once for one batch; providers with a batch API override `send_batch` instead.
    max_concurrency: ClassVar[int] = 16

    def send(self, message: OutboundMessage) -> SendResult:
        """Send one message; return the provider's id or raise ProviderError."""
        raise NotImplementedError

    def send_batch(self, messages: Sequence[OutboundMessage]) -> list[Outcome]:
        """Send many messages; return one outcome per message, in order.

        The default makes the calls concurrently on a bounded thread pool: provider calls are I/O-bound,
        so a batch of 500 at 50 ms each takes tens of calls' time, not five hundred.
        """
        if len(messages) == 1:
            return [self._send_one(messages[0])]
        workers = max(1, min(self.max_concurrency, len(messages)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"send-{self.name}") as pool:
            # Each call's span (and its HTTP span) belongs under the batch's span, not in a trace of its own.
            return list(pool.map(tracing.carry_context(self._send_one), messages))

    def _send_one(self, message: OutboundMessage) -> Outcome:
        with tracing.provider_span(self.name, message.channel, 1):
            try:
                return self.send(message)
            except ProviderError as exc:
                tracing.mark_error(exc)
                return exc

    @classmethod
    def from_settings(cls) -> Provider:
        """Build the adapter from Django settings; raise ConfigurationError if something is missing."""
        return cls()
