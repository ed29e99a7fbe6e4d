"""Structured JSON logs: structlog configuration, personal-data masking and per-delivery log context.

Every log line, whether written through structlog or through the standard library (Django, Celery, kombu),
goes through the same formatter: context variables bound for the current request or task are merged in
(notification_id, delivery_id, trace_id, ...), personal data is masked in every field and in the message,
and the result is one JSON object per line. Logging is wired by `config.ops_settings.LOGGING`, which names
`json_formatter` / `console_formatter` below; Django applies it at setup in every process (gunicorn,
Celery workers and beat, manage.py), which is also where structlog itself is configured.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

# Keys that carry identifiers we generate ourselves: never personal data, always kept verbatim (a
# 32-hex trace id or a UUID would otherwise look like a secret to the token pattern).
SAFE_KEYS = frozenset(
    {
        "notification_id",
        "delivery_id",
        "delivery_ids",
        "trace_id",
        "span_id",
        "parent_span_id",
        "traceparent",
        "task_id",
        "request_id",
        "campaign_id",
        "dead_letter_id",
        "timestamp",
        "level",
        "logger",
    }
)
# Keys whose value is personal data or a credential as a whole, whatever it looks like.
SENSITIVE_KEY = re.compile(
    r"(pass(word)?|secret|token|api[_-]?key|authorization|cookie|credential|signature|email|phone|address|"
    r"webhook_url|to_address|recipient_address|chat)",
    re.IGNORECASE,
)
REDACTED = "[redacted]"

# Our own ids, kept verbatim inside text: UUIDs (notifications) and W3C traceparent values.
_OWN_IDS = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
    r"|\b[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\b"
)
# The local part starts only where a run of its characters starts (the lookbehind): without it, a long run
# with no "@" was scanned again from every one of its positions, quadratic (3.3 s for 40,000 characters).
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9.!#$%&'*+/=?^_`{|}~-])[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+"
    r"@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)+"
)
# International numbers (E.164 with optional separators) and 10-digit national numbers (NANP style); plain
# dates such as 2026-01-31 do not match either form.
_PHONE = re.compile(
    r"(?<![\w+])\+\d(?:[\s().-]?\d){6,16}(?!\w)"
    r"|(?<![\w.:/-])\(?\d{3}\)?[\s.-]?\d{3}[\s.-]?\d{4}(?![\w.:/-])"
)
# Push tokens, API keys, signing secrets: long runs of token characters that mix letters and digits.
# Dots and slashes end a run, so module paths and URL paths survive.
_TOKEN = re.compile(r"(?<![A-Za-z0-9_:+=-])(?=[A-Za-z0-9_:+=-]*\d)(?=[A-Za-z0-9_:+=-]*[A-Za-z])[A-Za-z0-9_:+=-]{24,}")
_MAX_DEPTH = 8
# Every pattern above needs an "@" or a digit: text with neither (most log fields) skips the four passes.
_MAYBE_PERSONAL = re.compile(r"[@\d]")


# Masking reads at most this many characters of one field: longer text keeps its head and its tail (where a
# traceback says what failed) around a marker, so one huge value costs a bounded time.
MAX_FIELD_CHARS = 16_384


def _bounded(text: str) -> str:
    """Return `text`, or its head and tail around a marker when it is longer than MAX_FIELD_CHARS."""
    if len(text) <= MAX_FIELD_CHARS:
        return text
    half = MAX_FIELD_CHARS // 2
    return f"{text[:half]} [... {len(text) - 2 * half} characters cut ...] {text[-half:]}"


def mask_text(text: str) -> str:
    """Return `text` (bounded in length) with emails, phone numbers and long tokens replaced by placeholders."""
    if not text:
        return text
    text = _bounded(text)
    if not _MAYBE_PERSONAL.search(text):
        return text
    own: list[str] = []

    def _hold(match: re.Match[str]) -> str:
        own.append(match.group(0))
        return f"\x00{len(own) - 1}\x00"

    # Set our own ids aside so the token pattern leaves them alone.
    held = _OWN_IDS.sub(_hold, text)
    held = _EMAIL.sub("[email]", held)
    held = _TOKEN.sub("[token]", held)
    held = _PHONE.sub("[phone]", held)
    if own:
        held = re.sub(r"\x00(\d+)\x00", lambda m: own[int(m.group(1))], held)
    return held


_KEEP, _REDACT, _SCAN = 0, 1, 2


@functools.lru_cache(maxsize=4096)
def _key_policy(key: str) -> int:
    """Return how a field is masked by its name: _KEEP (our ids), _REDACT (secrets as a whole) or _SCAN."""
    if key in SAFE_KEYS:
        return _KEEP
    return _REDACT if SENSITIVE_KEY.search(key) else _SCAN


def mask_value(value: Any, key: str | None = None, _depth: int = 0) -> Any:
    """Return `value` with personal data masked, descending into mappings and sequences."""
    policy = _SCAN if key is None else _key_policy(key)
    if policy == _KEEP:
        return value
    if policy == _REDACT and value not in (None, "", [], {}):
        if not isinstance(value, (Mapping, list, tuple)):
            return REDACTED
    if _depth > _MAX_DEPTH:
        return REDACTED
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, Mapping):
        return {k: mask_value(v, str(k), _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [mask_value(v, key, _depth + 1) for v in value]
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    # Anything else (exceptions, model instances, dates) is logged by its text, masked like any text.
    return mask_text(str(value))


def mask_personal_data(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Mask emails, phone numbers and tokens in every field and in the message (a structlog processor)."""
    return {key: mask_value(value, key) for key, value in event_dict.items()}


def _drop_color_message(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    # Uvicorn-style duplicates of the message with ANSI colours would defeat masking and JSON readers.
    event_dict.pop("color_message", None)
    return event_dict


def _shared_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _drop_color_message,
    ]


_configured = False


def configure_structlog() -> None:
    """Configure structlog to hand its events to the standard library's handlers (idempotent)."""
    global _configured
    if _configured:
        return
    # No line shows the caller's file and line, so the standard library need not walk the stack for them on
    # every record (the documented switch; a tenth of the cost of a line).
    logging._srcfile = None
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.filter_by_level,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    _configured = True


BULK_LINES = "bulk_lines"
_PLAIN = frozenset({str, int, float, bool, type(None)})


def log_lines(logger: logging.Logger, level: int, lines: Sequence[Mapping[str, Any]]) -> None:
    """Write one log line per mapping (each with its own "event") through a single logging call.

    For the per-delivery audit lines of a batch: the same JSON lines, context, masking and handlers as one
    call each, at a fifth of the cost (one record and one write for the batch instead of hundreds).
    """
    if lines and logger.isEnabledFor(level):
        record = logger.makeRecord(logger.name, level, "", 0, "%d lines", (len(lines),), None)
        setattr(record, BULK_LINES, lines)
        logger.handle(record)


class _Formatter(structlog.stdlib.ProcessorFormatter):
    """structlog's formatter, which also renders a `log_lines` record as its lines."""

    def __init__(self, renderer: Processor, *, json_lines: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._renderer = renderer
        # The renderer is structlog's JSONRenderer(default=str): bulk lines may be written as JSON directly.
        self.json_lines = json_lines

    def format(self, record: logging.LogRecord) -> str:
        lines = getattr(record, BULK_LINES, None)
        if lines is None:
            return super().format(record)
        at = datetime.fromtimestamp(record.created, tz=UTC).isoformat().replace("+00:00", "Z")
        shared = {"level": record.levelname.lower(), "logger": record.name, "timestamp": at}
        context = structlog.contextvars.get_contextvars()
        method = record.levelname.lower()
        # The lines of one call share most of their values (the event, the notification, the channel): each
        # (field, value) is masked once per call, as masking is field by field, and in JSON also encoded once as
        # its `"field": value` member (what json.dumps writes for it inside the object). Only plain values are
        # remembered; the type is part of the key, as 1, 1.0 and True are equal as dict keys but not as values.
        memo: dict[tuple[str, type, Any], Any] = {}
        encode = self._member if self.json_lines else mask_value

        def done(key: str, value: Any) -> Any:
            kind = type(value)
            if kind not in _PLAIN:
                return encode(value, key)
            found = memo.get((key, kind, value), memo)
            if found is memo:
                found = memo[(key, kind, value)] = encode(value, key)
            return found

        if self.json_lines:
            return "\n".join(
                "{" + ", ".join([done(k, v) for k, v in {**context, **line, **shared}.items()]) + "}" for line in lines
            )
        return "\n".join(
            str(self._renderer(None, method, {k: done(k, v) for k, v in {**context, **line, **shared}.items()}))
            for line in lines
        )

    @staticmethod
    def _member(value: Any, key: str) -> str:
        return f"{json.dumps(key)}: {json.dumps(mask_value(value, key), default=str)}"


class ScheduledSendsFilter(logging.Filter):
    """Drop celery beat's "Scheduler: Sending due task …" lines, one per scheduled send.

    The workflow wake-up is due every second, so beat logged a line a second whatever the load (and honcho
    relayed it under `make run`); beat's other lines (its start, its errors) pass.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Return False for a due-task line."""
        return not str(record.msg).startswith("Scheduler: Sending due task")


def _formatter(renderer: Processor, *, json_lines: bool = False) -> _Formatter:
    """Return a formatter that masks personal data, then renders with `renderer`."""
    # Django applies LOGGING in every process before any of our code logs: the right moment to configure
    # structlog too, without asking each entry point to remember it.
    configure_structlog()
    return _Formatter(
        renderer,
        json_lines=json_lines,
        foreign_pre_chain=_shared_processors(),
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            # Tracebacks become text before masking, so a personal value inside an exception is masked too.
            structlog.processors.format_exc_info,
            mask_personal_data,
            renderer,
        ],
    )


def json_formatter() -> _Formatter:
    """Return the formatter that renders every record as one masked JSON object (named in LOGGING)."""
    return _formatter(structlog.processors.JSONRenderer(default=str), json_lines=True)


def console_formatter() -> structlog.stdlib.ProcessorFormatter:
    """Return a human-readable (still masked) formatter for local development (LOG_FORMAT=console)."""
    return _formatter(structlog.dev.ConsoleRenderer(colors=False))


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    """Return a structlog logger; its lines carry the bound context and are masked like all others."""
    configure_structlog()
    return structlog.stdlib.get_logger(name)


class BoundContext:
    """Ids bound into the log context; leaving the `with` block (or calling `reset`) unbinds them."""

    def __init__(self, tokens: Mapping[str, Any]) -> None:
        self._tokens = dict(tokens)

    def reset(self) -> None:
        """Restore the context as it was before the ids were bound."""
        if self._tokens:
            structlog.contextvars.reset_contextvars(**self._tokens)
            self._tokens = {}

    def __enter__(self) -> BoundContext:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.reset()


def bind_delivery_context(**ids: Any) -> BoundContext:
    """Bind ids (notification_id, delivery_id, trace_id, ...) to every log line of this request or task.

    Works as a plain call (bound until the task's context is cleared) or as a context manager::

        with bind_delivery_context(notification_id=n.id, delivery_id=d.id):
            ...
    """
    clean = {key: (str(value) if not isinstance(value, (int, list)) else value) for key, value in ids.items()}
    clean = {key: value for key, value in clean.items() if value not in (None, "", "None")}
    return BoundContext(structlog.contextvars.bind_contextvars(**clean))


def clear_log_context() -> None:
    """Forget everything bound for the previous request or task (threads and prefork children are reused)."""
    structlog.contextvars.clear_contextvars()


def bound_log_context() -> dict[str, Any]:
    """Return what is bound for the current request or task."""
    return structlog.contextvars.get_contextvars()


@contextmanager
def log_context(**ids: Any) -> Iterator[None]:
    """Bind ids for the duration of a block."""
    with bind_delivery_context(**ids):
        yield
