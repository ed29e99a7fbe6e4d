"""Outcome rules without services: what a provider's answer or exception does to its delivery.

The send pipeline hands every answer to `Outcomes.answer` and every batch's answers to `guards.outcomes_tally`;
both only record until `flush()`, so their decisions are checked here on unsaved deliveries.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from hypothesis import given
from hypothesis import strategies as st

from channels_app.guards import outcomes_tally
from channels_app.outcomes import BatchReport, DbClock, Outcomes, backoff_seconds, describe_exception
from channels_app.providers.base import (
    DeadlineExceeded,
    OutboundMessage,
    Outcome,
    PermanentError,
    Provider,
    ProviderError,
    RetriableError,
    SendResult,
    UnexpectedError,
)
from notifier.deliveries.models import Delivery

pytestmark = pytest.mark.pure

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MAX = settings.DELIVERY_MAX_ATTEMPTS

texts = st.text(max_size=40)
codes = st.sampled_from(["", "21211", "invalid_token", "throttled", "5xx"])
hints = st.none() | st.floats(min_value=0, max_value=3600, allow_nan=False)
# Exceptions a bug or a bad setting raises inside an adapter: anything that is not a ProviderError.
BUGS = (
    ValueError,
    KeyError,
    TypeError,
    RuntimeError,
    AttributeError,
    ZeroDivisionError,
    OSError,
    LookupError,
    Exception,
)
bugs = st.builds(lambda kind, text: kind(text), st.sampled_from(BUGS), texts)

provider_errors = st.one_of(
    st.builds(ProviderError, texts, retriable=st.booleans(), code=codes, retry_after=hints, throttled=st.booleans(),
              suppress=st.booleans(), maybe_sent=st.booleans()),
    st.builds(PermanentError, texts, code=codes, suppress=st.booleans()),
    st.builds(RetriableError, texts, code=codes, retry_after=hints, throttled=st.booleans(), maybe_sent=st.booleans()),
    st.builds(DeadlineExceeded, st.floats(min_value=0.1, max_value=120)),
    st.builds(UnexpectedError, bugs),
)  # fmt: skip
outcomes = st.builds(SendResult, texts) | provider_errors


def _subclasses(cls: type[ProviderError]) -> set[type[ProviderError]]:
    found = {cls}
    for sub in cls.__subclasses__():
        found |= _subclasses(sub)
    return found


def test_the_strategies_cover_every_kind_of_provider_error() -> None:
    # A new kind of ProviderError is a new case of the rules below: add it to `provider_errors`.
    import channels_app.providers.registry  # noqa: F401 - loads every adapter, and any error class of its own

    assert _subclasses(ProviderError) == {
        ProviderError,
        PermanentError,
        RetriableError,
        DeadlineExceeded,
        UnexpectedError,
    }


def _delivery(attempts: int, address: str) -> Delivery:
    return Delivery(pk=41, channel="sms", priority="normal", address=address, attempts=attempts, provider="")


@given(outcomes, st.integers(min_value=1, max_value=MAX + 2), st.sampled_from(["", "+4915112345678"]))
def test_every_answer_ends_in_exactly_one_outcome(outcome: Outcome, attempts: int, address: str) -> None:
    delivery = _delivery(attempts, address)
    report = BatchReport()
    out = Outcomes(report, clock=DbClock(NOW))
    out.answer(delivery, "twilio", outcome, {"text": "hi"})

    [(recorded, fields)] = out.updates
    status = fields["status"]
    assert recorded is delivery
    assert [event[:2] for event in out.events] == [(41, status)]
    assert report.outcomes == {41: status}
    assert report.sent + report.retried + report.failed == 1
    assert report.dead_lettered == len(out.dead)
    dead = [reason for _, _, reason in out.dead]
    republished = [d for waiting in out.republish.values() for d in waiting]
    if isinstance(outcome, SendResult):
        assert status == "sent" and fields["provider_message_id"] == outcome.provider_message_id
        assert (dead, out.suppress, republished) == ([], [], [])
    elif isinstance(outcome, UnexpectedError):
        # Our fault, not the provider's answer: never retried (it would raise again), kept for an operator.
        assert status == "failed" and fields["reason"] == f"error:{outcome.cause_name}" and dead == ["poison"]
    elif outcome.retriable and attempts < MAX:
        assert status == "queued" and fields["reason"] == "retry" and dead == [] and republished == [delivery]
        # Never sooner than the provider asked, and pinned to the provider when it may have acted on the attempt.
        assert fields["not_before"] >= NOW + timedelta(seconds=outcome.retry_after or 0.0)
        assert fields.get("pinned_provider") == ("twilio" if outcome.maybe_sent else None)
    elif outcome.retriable:
        assert status == "failed" and fields["reason"] == "attempts_exhausted" and dead == ["attempts_exhausted"]
    else:
        assert status == "failed" and dead == [] and republished == []
        assert fields["reason"] == (outcome.code or type(outcome).__name__)[:255]
    # Only a permanent answer about the address puts it on the suppression list.
    about_address = isinstance(outcome, ProviderError) and not outcome.retriable and outcome.suppress and address
    assert out.suppress == ([("sms", address, outcome.code or "invalid")] if about_address else [])


class _Raising(Provider):
    name = "raising"
    channels = ("sms",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def send(self, message: OutboundMessage) -> SendResult:
        raise self.exc


@given(provider_errors | bugs)
def test_whatever_an_adapter_raises_becomes_that_messages_outcome(exc: Exception) -> None:
    message = OutboundMessage(delivery_id=41, channel="sms", address="+4915112345678", content={}, idempotency_key="k")
    outcome = _Raising(exc)._send_one(message)
    if isinstance(exc, ProviderError):
        assert outcome is exc
    else:
        assert isinstance(outcome, UnexpectedError) and outcome.cause_name == type(exc).__name__
        assert not outcome.retriable


@given(st.lists(outcomes, max_size=20))
def test_a_batch_tally_counts_each_answer_once_and_unexpected_ones_nowhere(answers: list[Outcome]) -> None:
    tally = outcomes_tally(answers)
    counted = [o for o in answers if not isinstance(o, UnexpectedError)]
    assert tally.answered + tally.failing + tally.throttled == len(counted)
    # A permanent error is an answer: the provider is up, the message was not fine.
    assert tally.answered == sum(1 for o in counted if isinstance(o, SendResult) or not o.retriable)
    throttled = [o for o in counted if isinstance(o, ProviderError) and o.retriable and o.throttled]
    assert tally.throttled == len(throttled)
    assert tally.retry_after == (max(o.retry_after or 0.0 for o in throttled) or None if throttled else None)


@given(st.integers(min_value=0, max_value=60), hints)
def test_backoff_grows_within_its_bounds_and_honours_retry_after(attempt: int, retry_after: float | None) -> None:
    base, ceiling = settings.RETRY_BACKOFF_BASE_SECONDS, settings.RETRY_BACKOFF_MAX_SECONDS
    delay = backoff_seconds(attempt, retry_after)
    cap = min(ceiling, base * 2 ** max(attempt - 1, 0))
    assert delay >= (retry_after or 0.0)
    assert base / 2 <= delay <= max(cap, base, retry_after or 0.0)


@given(bugs, st.text(max_size=3000))
def test_a_described_exception_is_one_bounded_line_naming_its_class(exc: Exception, text: str) -> None:
    exc = type(exc)(text)
    described = describe_exception(exc)
    assert described.startswith(f"{type(exc).__name__}: ")
    assert "\n" not in described and "\r" not in described and len(described) <= 1000
    assert describe_exception(UnexpectedError(exc)) == UnexpectedError(exc).description


def test_a_described_exception_keeps_no_address() -> None:
    described = describe_exception(ValueError("no route to alice@example.com or +4915112345678"))
    assert "alice@example.com" not in described and "+4915112345678" not in described
