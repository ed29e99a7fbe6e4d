"""The one small interface every provider adapter implements.

An adapter turns an `OutboundMessage` (a rendered template and an address) into a provider call and either
returns the provider's message id or raises a `ProviderError` that says whether trying again can help.
After healthchecks' `hc/integrations/*/transport.py`: one adapter per provider, errors sorted at the edge.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar, Self

import requests
from django.conf import settings
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

from core import tracing
from core.logs import mask_text


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


class UnexpectedError(ProviderError):
    """Anything other than a ProviderError raised for one message (a bug, a bad per-client setting).

    Carried as an outcome so it fails that delivery alone; never retried (the same input raises again) and
    never counted by the breaker (the provider did not answer).
    """

    def __init__(self, exc: BaseException) -> None:
        self.cause_name = type(exc).__name__
        text = mask_text(str(exc)[:2000]).replace("\r", " ").replace("\n", " ")
        self.description = f"{self.cause_name}: {text}"[:1000]
        super().__init__(self.description, retriable=False, code=f"error:{self.cause_name}")

    def __str__(self) -> str:
        return self.description


class DeadlineExceeded(RetriableError):
    """A call ran past its total deadline; the provider may have acted on it (same provider only)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no answer within the {seconds:g}s call deadline", code="deadline", maybe_sent=True)


def connection_not_made(exc: requests.exceptions.ConnectionError) -> bool:
    """Say whether a requests connection error happened before any byte of the request was sent.

    A refused or timed-out connect sent nothing: another provider may have the message. A connection reset
    or aborted after the request was written may have been acted on (`maybe_sent`).
    """
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    return isinstance(reason, NewConnectionError | ConnectTimeoutError)


class ConfigurationError(Exception):
    """A provider was switched on with settings missing or wrong; raised at start-up."""


Outcome = SendResult | ProviderError
# The index `send_stream(ticks=True)` yields (with no outcome) once every answer that had arrived is handed over:
# after each group of answers, and every quarter of a second while none arrive.
TICK = -1


class Provider:
    """Base class of every adapter. Subclasses set `name` and `channels` and implement `send`."""

    name: ClassVar[str] = ""
    channels: ClassVar[tuple[str, ...]] = ()
    # Calls in flight at once for one batch; providers with a batch API override `send_batch` instead.
    max_concurrency: int = 16  # an instance may set its own (its pool size)
    # The total time one call may take (connect, send, the whole answer). Adapters that can abort a call
    # themselves do so (the webhook adapter); `send_stream` stops waiting for any call past it in any case.
    call_deadline: float = 30.0
    # Messages per `send_batch` call when a provider with a batch API streams its outcomes.
    stream_chunk: ClassVar[int] = 500
    # The settings a named account of this provider may have in PROVIDER_ACCOUNTS (none: no accounts).
    account_keys: ClassVar[tuple[str, ...]] = ()

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
        outcomes: list[Outcome | None] = [None] * len(messages)
        workers = max(1, min(self.max_concurrency, len(messages)))
        for index, outcome in self._stream_pool(messages, workers=workers):
            outcomes[index] = outcome
        return [o for o in outcomes if o is not None]

    def _send_one(self, message: OutboundMessage) -> Outcome:
        """Send one message; whatever it raises becomes that message's outcome, never its neighbours'."""
        with tracing.provider_span(self.name, message.channel, 1):
            try:
                return self.send(message)
            except ProviderError as exc:
                tracing.mark_error(exc)
                return exc
            except Exception as exc:  # a bug or a bad per-client setting fails this delivery alone
                tracing.mark_error(exc)
                return UnexpectedError(exc)

    def _has_batch_api(self) -> bool:
        return type(self).send_batch is not Provider.send_batch

    def send_stream(
        self, messages: Sequence[OutboundMessage], *, window: threading.Semaphore | None = None, ticks: bool = False
    ) -> Iterator[tuple[int, Outcome | None]]:
        """Send many messages; yield (index, outcome) as each answer arrives, in no particular order.

        With `ticks`, (TICK, None) is also yielded after each group of answers that arrived together (a batch API's
        chunk, the calls a wait found finished) and whenever none arrived for a quarter of a second: the caller
        can write what it holds then, in groups that grow with the provider's speed and never pass the window.

        `window`, when given, is taken before each call and released by the caller once that call's outcome is
        written: calls in flight plus answers not yet written never exceed it, which bounds what a worker that
        dies can repeat.

        Every call is bounded by `call_deadline`: past it the call is given up as `DeadlineExceeded` (ambiguous:
        retried on the same provider with the same idempotency key) and its thread is left to end on its own.
        Providers with a batch API are called a chunk at a time; a chunk that raises is retried message by
        message, so one poison message fails alone.
        """
        if self._has_batch_api():
            yield from self._stream_chunks(messages, ticks=ticks)
            return
        workers = max(1, min(self.max_concurrency, len(messages)))
        yield from self._stream_pool(messages, workers=workers, window=window, ticks=ticks)

    def _stream_chunks(self, messages: Sequence[OutboundMessage], *, ticks: bool = False) -> Iterator[tuple[int, Any]]:
        size = max(1, self.stream_chunk)
        for start in range(0, len(messages), size):
            chunk = messages[start : start + size]
            try:
                with tracing.provider_span(self.name, chunk[0].channel, len(chunk), operation="send_batch"):
                    outcomes = self.send_batch(chunk)
            except Exception:
                outcomes = [self._send_one(m) for m in chunk]
            for offset, outcome in enumerate(outcomes):
                yield start + offset, outcome
            if ticks:
                yield TICK, None  # the chunk's answers arrived together: the caller writes them as one group

    def _stream_pool(
        self,
        messages: Sequence[OutboundMessage],
        *,
        workers: int,
        window: threading.Semaphore | None = None,
        ticks: bool = False,
    ) -> Iterator[tuple[int, Outcome | None]]:
        started: dict[int, float] = {}
        lock = threading.Lock()
        closing = threading.Event()

        def run(index: int) -> Outcome:
            if window is not None:
                while not window.acquire(timeout=0.5):
                    if closing.is_set():
                        return RetriableError("not attempted: batch ended", code="stalled")
            with lock:
                started[index] = time.monotonic()
            return self._send_one(messages[index])

        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"send-{self.name}")
        try:
            # Each call's span (and its HTTP span) belongs in the task's trace: pool threads start without one.
            traced = tracing.carry_context(run)
            futures: dict[Future[Outcome], int] = {pool.submit(traced, i): i for i in range(len(messages))}
            pending = set(futures)
            abandoned = 0
            while pending:
                done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                for future in done:
                    yield futures[future], future.result()
                if ticks:
                    # Every answer that had arrived is handed over (or none arrived for a while): the caller may
                    # write what it holds.
                    yield TICK, None
                now = time.monotonic()
                with lock:
                    late = [f for f in pending if now - started.get(futures[f], now) > self.call_deadline]
                for future in late:
                    pending.discard(future)
                    abandoned += 1
                    yield futures[future], DeadlineExceeded(self.call_deadline)
                if abandoned >= workers:
                    # Every thread is stuck in a call that outlived its deadline: what has not started yet
                    # would never start. It was never sent, so it may go anywhere next time.
                    for future in list(pending):
                        if future.cancel():
                            pending.discard(future)
                            yield futures[future], RetriableError("not attempted: calls stalled", code="stalled")
        finally:
            # Calls given up on are not waited for: their threads end when their own timeouts fire.
            closing.set()
            pool.shutdown(wait=False, cancel_futures=True)

    @classmethod
    def from_settings(cls) -> Provider:
        """Build the adapter from Django settings; raise ConfigurationError if something is missing."""
        return cls()

    @classmethod
    def from_account(cls, options: AccountOptions) -> Provider:
        """Build the adapter of a named account (PROVIDER_ACCOUNTS); raise ConfigurationError if it is incomplete."""
        raise ConfigurationError(f"provider '{cls.name}' cannot be used as a named account")


class AccountOptions:
    """One account's settings from PROVIDER_ACCOUNTS, read by key with a default; unknown keys are refused.

    Errors name the key, never its value (it may be a secret).
    """

    def __init__(self, options: dict[str, Any], known: Sequence[str]) -> None:
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ConfigurationError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        self.options = options

    def text(self, key: str, default: str = "") -> str:
        """Return a text setting (an absent or empty one: `default`)."""
        value = self.options.get(key)
        if value is None or value == "":
            return default
        if not isinstance(value, str):
            raise ConfigurationError(f"'{key}' must be a string")
        return value

    def number(self, key: str, default: float) -> float:
        """Return a number setting."""
        value = self.options.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigurationError(f"'{key}' must be a number")
        return float(value)

    def flag(self, key: str, default: bool = False) -> bool:
        """Return a true/false setting."""
        value = self.options.get(key, default)
        if not isinstance(value, bool):
            raise ConfigurationError(f"'{key}' must be true or false")
        return value


class BotProvider(Provider):
    """A chat network's bot: one token, an endpoint and a timeout, the installation's or a named account's.

    A subclass names its settings' prefix (`SLACK`: SLACK_BOT_TOKEN, SLACK_BASE_URL, SLACK_TIMEOUT_SECONDS) and
    takes them in `__init__`. An account (PROVIDER_ACCOUNTS) brings its own `bot_token`, never the installation's;
    its endpoint and timeout default to the installation's.
    """

    settings_prefix: ClassVar[str] = ""
    account_keys: ClassVar[tuple[str, ...]] = ("bot_token", "base_url", "timeout_seconds")

    def __init__(self, *, token: str, base_url: str, timeout: float, pool_size: int) -> None:
        """Set up the network's client for this bot."""
        raise NotImplementedError

    @classmethod
    def from_settings(cls) -> Self:
        """Build the installation's bot from the <PREFIX>_* settings; name the variable that is missing."""
        name = f"{cls.settings_prefix}_BOT_TOKEN"
        return cls._bot(getattr(settings, name), name, AccountOptions({}, cls.account_keys))

    @classmethod
    def from_account(cls, options: AccountOptions) -> Self:
        """Build a named account's bot: its own token; the endpoint and timeout default to the installation's."""
        return cls._bot(options.text("bot_token"), "bot_token", options)

    @classmethod
    def _bot(cls, token: str, token_name: str, options: AccountOptions) -> Self:
        if not token:
            raise ConfigurationError(f"{token_name} is not set")
        prefix = cls.settings_prefix
        return cls(
            token=token,
            base_url=options.text("base_url", getattr(settings, f"{prefix}_BASE_URL")),
            timeout=options.number("timeout_seconds", getattr(settings, f"{prefix}_TIMEOUT_SECONDS")),
            pool_size=settings.PROVIDER_CONCURRENCY,
        )
