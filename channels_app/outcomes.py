"""The send pipeline's outcome writer: every status change a worker makes goes through `Outcomes`.

A batch is how work travels, a delivery is what fails. The writer collects per-delivery outcomes (sent,
retry, wait, failed, suppressed, cancelled) and writes them with a few bulk statements whenever `flush()` is
called: the pipeline flushes as provider answers arrive (in small groups bounded by the calls in flight), so
a worker that dies loses at most the answers of the calls it had in flight.

Time is the database's: `now` is the database clock read at claim time plus the monotonic time elapsed
since, so `not_before` and the lease compare with PostgreSQL's `now()` whatever the worker's own clock says.

Hooks that react to status changes (status events to the caller, channel fallback) belong in `flush()`,
which sees every change of a group at once.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from channels_app.deadletter import publish_dead_letters
from channels_app.providers.base import Outcome, ProviderError, SendResult, UnexpectedError
from channels_app.sms_fit import count_sent as count_sms_segments
from core import metrics
from core.logs import log_lines, mask_text
from core.queues import queue_name
from notifier.deadletters.models import DeadLetter
from notifier.deliveries import fallback
from notifier.deliveries.models import Delivery
from notifier.deliveries.outbox import publish
from notifier.deliveries.selectors import delivery_mode
from notifier.deliveries.status import outcomes_write, outcomes_write_with_events, record_events
from preferences.services import suppression_add
from templates_app.rendering import RenderError

_audit_log = logging.getLogger("channels_app.services")
logger = logging.getLogger(__name__)

S = Delivery.Status


@dataclass
class BatchReport:
    """What happened to one batch; returned for tests, logs and metrics."""

    claimed: int = 0
    sent: int = 0
    retried: int = 0
    deferred: int = 0
    failed: int = 0
    suppressed: int = 0
    dead_lettered: int = 0
    outcomes: dict[int, str] = field(default_factory=dict)


class DbClock:
    """The database's clock, read once and carried forward with the local monotonic clock."""

    def __init__(self, db_now: datetime | None = None) -> None:
        self.base = db_now or timezone.now()
        self.mono = time.monotonic()

    def now(self) -> datetime:
        """Return the database's current time as this process best knows it."""
        return self.base + timedelta(seconds=time.monotonic() - self.mono)


def backoff_seconds(attempt: int, retry_after: float | None = None) -> float:
    """Return the delay before retry `attempt`: exponential with full jitter, never less than Retry-After."""
    cap = min(settings.RETRY_BACKOFF_MAX_SECONDS, settings.RETRY_BACKOFF_BASE_SECONDS * (2 ** max(attempt - 1, 0)))
    delay = random.uniform(settings.RETRY_BACKOFF_BASE_SECONDS / 2, max(cap, settings.RETRY_BACKOFF_BASE_SECONDS))
    return max(delay, retry_after or 0.0)


def describe_exception(exc: BaseException) -> str:
    """Return "<ExceptionClass>: <masked message>" for last_error: enough to fix it, no personal data."""
    if isinstance(exc, UnexpectedError):
        return exc.description
    text = mask_text(str(exc)[:2000]).replace("\r", " ").replace("\n", " ")
    return f"{type(exc).__name__}: {text}"[:1000]


class Outcomes:
    """Collects per-delivery outcomes and writes each group with a few bulk statements on `flush()`."""

    def __init__(self, report: BatchReport, *, clock: DbClock | None = None) -> None:
        self.report = report
        self.clock = clock or DbClock()
        # Admitted breaker slots per provider for this batch (channels_app.guards hands them out).
        self.breaker_slots: dict[str, list[float]] = {}
        # What is wrong with a project's provider account for a channel ("channel:name" -> problem, "" none):
        # checked once per batch, not once per delivery (channels_app.guards).
        self.account_problems: dict[str, str] = {}
        # Whether status changes may concern anyone listening (an in-app delivery, a client with an event
        # endpoint): decided once per batch by the pipeline; when not, no status-event statement per write.
        self.reach = True
        self._reset()

    def _reset(self) -> None:
        self.updates: list[tuple[Delivery, dict[str, Any]]] = []
        self.events: list[tuple[int, str, str]] = []
        self.republish: dict[float, list[Delivery]] = defaultdict(list)
        self.dead: list[tuple[Delivery, str, str]] = []
        self.suppress: list[tuple[str, str, str]] = []

    @property
    def now(self) -> datetime:
        """Return the database's current time."""
        return self.clock.now()

    @property
    def pending(self) -> int:
        """Return how many outcomes wait for the next flush."""
        return len(self.updates)

    # --- recording ----------------------------------------------------------------------------------------

    def set(self, delivery: Delivery, status: str, detail: str = "", **fields: Any) -> None:
        """Record a status change with its event."""
        self.updates.append((delivery, {"status": status, **fields}))
        self.events.append((delivery.pk, status, detail))
        self.report.outcomes[delivery.pk] = status

    def note(self, delivery: Delivery, **fields: Any) -> None:
        """Record field changes that are not a status change (the template version a delivery used)."""
        self.updates.append((delivery, fields))

    def event(self, delivery_id: int, status: str, detail: str) -> None:
        """Record an event that is not a status change (a failover decision)."""
        self.events.append((delivery_id, status, detail))

    def answer(self, delivery: Delivery, provider: str, outcome: Outcome, content: dict[str, Any]) -> None:
        """Record a provider's answer to one delivery, whatever it is.

        Accepted: sent. A retriable error: another attempt after a backoff, or failed and dead-lettered once the
        attempts are used up. Any other error: failed, and dead-lettered when it was unexpected (our fault, not
        the provider's answer).
        """
        if isinstance(outcome, SendResult):
            self.sent(delivery, provider, outcome, content, at=self.now)
        elif outcome.retriable:
            self.retry(delivery, outcome, provider)
        else:
            self.failed(delivery, outcome, provider)

    def sent(
        self, delivery: Delivery, provider: str, result: SendResult, content: dict[str, Any], at: datetime
    ) -> None:
        """Record a provider's acceptance."""
        fields: dict[str, Any] = {"provider": provider, "provider_message_id": result.provider_message_id}
        fields["sent_at"] = at  # when the provider accepted it, not when the batch started
        fields["last_error"] = ""
        if delivery.channel == "inapp":
            fields["content"] = content
        self.set(delivery, S.SENT, provider, **fields)
        self.report.sent += 1

    def cancelled(self, delivery: Delivery) -> None:
        """Record a delivery cancelled while it waited."""
        self.set(delivery, S.CANCELLED, "cancelled")

    def suppressed(self, delivery: Delivery, reason: str) -> None:
        """Record a delivery the compliance re-check suppressed."""
        self.set(delivery, S.SUPPRESSED, reason, reason=reason)
        self.report.suppressed += 1

    def wait(self, delivery: Delivery, *, until: datetime | None, reason: str, uncount: bool = True) -> None:
        """Defer without spending an attempt; a short wait goes back to the broker as a delayed message.

        The ambiguous-attempt pin (`pinned_provider`) is a field of its own: no deferral touches it.
        """
        now = self.now
        fields: dict[str, Any] = {"reason": reason, "not_before": until}
        if uncount:
            fields["attempts"] = max(delivery.attempts - 1, 0)
        delay = (until - now).total_seconds() if until else None
        if delay is not None and delay <= settings.BROKER_DELAY_MAX_SECONDS:
            self.republish[max(delay, 0.0)].append(delivery)
            fields["published_at"] = now
        else:
            # Long waits (quiet hours, digests) stay in the database; the relay wakes them when due.
            fields["published_at"] = None
        self.set(delivery, S.DEFERRED, reason, **fields)
        self.report.deferred += 1

    def failed(self, delivery: Delivery, error: ProviderError | RenderError | str, provider: str = "") -> None:
        """Fail a delivery for good; an unexpected exception is dead-lettered for an operator to look at."""
        if isinstance(error, UnexpectedError):
            self.poison(delivery, error, provider=provider)
            return
        reason = getattr(error, "code", "") or type(error).__name__ if not isinstance(error, str) else error
        self.set(delivery, S.FAILED, str(error), reason=str(reason)[:255], last_error=str(error), provider=provider)
        self.report.failed += 1
        if isinstance(error, ProviderError) and error.suppress and delivery.address:
            self.suppress.append((delivery.channel, delivery.address, str(error.code or "invalid")))

    def poison(self, delivery: Delivery, exc: BaseException, *, provider: str = "", stage: str = "") -> None:
        """Fail one delivery whose rendering, building or sending raised something unexpected.

        Only this delivery pays: it is `failed` with the exception's class and masked message, and
        dead-lettered (a code or configuration fault an operator fixes, then replays).
        """
        text = describe_exception(exc)
        name = exc.cause_name if isinstance(exc, UnexpectedError) else type(exc).__name__
        detail = f"{stage}: {text}" if stage else text
        self.set(delivery, S.FAILED, detail, reason=f"error:{name}"[:255], last_error=detail, provider=provider or "")
        self.dead.append((delivery, detail, "poison"))
        self.report.failed += 1
        self.report.dead_lettered += 1

    def exhausted(self, delivery: Delivery, detail: str, *, last_error: str, provider: str = "") -> None:
        """Fail a delivery that has used up its attempts and dead-letter it."""
        self.set(
            delivery,
            S.FAILED,
            detail,
            reason="attempts_exhausted",
            last_error=last_error,
            provider=provider or delivery.provider,
        )
        self.dead.append((delivery, last_error, "attempts_exhausted"))
        self.report.failed += 1
        self.report.dead_lettered += 1

    def retry(self, delivery: Delivery, error: ProviderError, provider: str) -> None:
        """Schedule another attempt with backoff, or fail the delivery if its attempts are used up."""
        if delivery.attempts >= settings.DELIVERY_MAX_ATTEMPTS:
            self.exhausted(delivery, f"attempts exhausted: {error}", last_error=str(error), provider=provider)
            return
        delay = backoff_seconds(delivery.attempts, error.retry_after)
        fields: dict[str, Any] = {}
        if error.maybe_sent:
            # The request may have reached this provider: every later attempt goes to it only (it may deduplicate
            # on our idempotency key), whatever deferrals come in between.
            fields["pinned_provider"] = provider
        self.set(
            delivery,
            S.QUEUED,
            f"retry in {delay:.1f}s after: {error}" + (" (ambiguous: same provider only)" if error.maybe_sent else ""),
            reason="retry",
            last_error=str(error),
            provider=provider,
            not_before=self.now + timedelta(seconds=delay),
            published_at=self.now,
            **fields,
        )
        self.republish[delay].append(delivery)
        self.report.retried += 1

    # --- writing ------------------------------------------------------------------------------------------

    def _log_outcomes(self, updates: list[tuple[Delivery, dict[str, Any]]]) -> None:
        """Write one audit line per outcome: who (ids only), which channel and provider, what happened.

        Deliveries sent are left out when DELIVERY_SENT_LOGS is off: they are nearly every outcome of a topic.
        """
        if not _audit_log.isEnabledFor(logging.INFO):
            return  # hundreds of lines per batch: not even built when nobody keeps them
        skip_sent = not settings.DELIVERY_SENT_LOGS
        lines = []
        for delivery, fields in updates:
            if "status" not in fields or (skip_sent and fields["status"] == S.SENT):
                continue
            line = {
                "event": "delivery " + fields["status"],
                "notification_id": str(delivery.notification_id),
                "delivery_id": delivery.pk,
                "channel": delivery.channel,
                "provider": fields.get("provider") or delivery.provider,
                "attempts": delivery.attempts,
                "reason": fields.get("reason", ""),
            }
            if delivery.notification.trace_id:
                line["trace_id"] = delivery.notification.trace_id
            lines.append(line)
        log_lines(_audit_log, logging.INFO, lines)

    @staticmethod
    def _count_metrics(updates: list[tuple[Delivery, dict[str, Any]]]) -> None:
        counts: dict[tuple[str, str, str, str], int] = defaultdict(int)
        for delivery, fields in updates:
            if "status" in fields:
                provider = fields.get("provider") or delivery.provider or "none"
                counts[(delivery.channel, provider, fields["status"], delivery_mode(delivery))] += 1
        for (channel, provider, status, mode), n in counts.items():
            metrics.count_deliveries(channel, provider, status, n, mode=mode)
        count_sms_segments(updates)
        # Accept (or due time, for scheduled and retried ones) to the provider's acknowledgement.
        latencies: dict[tuple[str, str], list[float]] = defaultdict(list)
        for delivery, fields in updates:
            if fields.get("status") == Delivery.Status.SENT and fields.get("sent_at") is not None:
                # The notification's accept time: the batch loaded it already, while the delivery's own
                # created_at is left out of the send path's load (reading it would be a query per delivery).
                accepted = delivery.notification.created_at
                due = max(accepted, delivery.not_before or accepted)
                latencies[(delivery.channel, delivery.priority)].append((fields["sent_at"] - due).total_seconds())
        for (channel, priority), values in latencies.items():
            metrics.observe_delivery_latency(channel, priority, values)

    def _write(
        self,
        updates: list[tuple[Delivery, dict[str, Any]]],
        events: list[tuple[int, str, str]],
        dead: list[tuple[Delivery, str, str]],
        suppress: list[tuple[str, str, str]],
        at: datetime,
    ) -> None:
        if not self.reach and not dead and not suppress:
            outcomes_write_with_events(updates, events, at)
            return
        with transaction.atomic():
            outcomes_write(updates, at)
            record_events(events, at=at, reach=self.reach)
            # In the same transaction as the failure: once a delivery reads failed, its address is suppressed.
            for channel, address, code in suppress:
                suppression_add(channel=channel, address=address, source="invalid", reason=f"provider error {code}")
            DeadLetter.objects.bulk_create(
                [
                    DeadLetter(
                        delivery=d,
                        channel=d.channel,
                        queue=f"dead.{d.channel}",
                        reason=reason,
                        attempts=d.attempts,
                        last_error=err[:4000],
                    )
                    for d, err, reason in dead
                ]
            )

    def flush(self, *, retry_for: float | None = None) -> None:
        """Write every pending outcome, then publish its retries and dead letters (after commit).

        A database that went away mid-batch does not lose the answers already received: the write is retried
        (reconnecting) for up to `retry_for` seconds (default: OUTCOME_WRITE_RETRY_SECONDS), then the error is
        raised. The heartbeat keeps renewing the lease meanwhile, so the retries may outlast the lease.
        """
        if not self.updates and not self.events:
            return
        updates, events, republish, dead, suppress = self.updates, self.events, self.republish, self.dead, self.suppress
        self._reset()
        budget = settings.OUTCOME_WRITE_RETRY_SECONDS if retry_for is None else retry_for
        deadline = time.monotonic() + budget
        pause = 0.5
        while True:
            try:
                self._write(updates, events, dead, suppress, self.now)
                break
            except (OperationalError, InterfaceError):
                if time.monotonic() + pause > deadline:
                    raise
                logger.warning("outcome write failed (database unreachable); retrying in %.1fs", pause)
                connection.close()
                time.sleep(pause)
                pause = min(pause * 2, 5.0)
        self._count_metrics(updates)
        self._log_outcomes(updates)
        # Smarter delivery hook (notifier/fallback.py): a fallback chain's next step may start, or be skipped.
        fallback.after_outcomes(updates)
        now = self.now
        # Delayed messages are routed by whole seconds anyway (publish rounds up): one message per second of
        # delay and queue, not one per delivery (rate-limit waits are spread a fraction of a second apart).
        by_second: dict[int, list[Delivery]] = defaultdict(list)
        for delay, deliveries in republish.items():
            by_second[math.ceil(delay)].extend(deliveries)
        for seconds, deliveries in sorted(by_second.items()):
            groups: dict[str, list[int]] = defaultdict(list)
            for d in deliveries:
                groups[queue_name(d.channel, d.priority)].append(d.pk)
            published = set(publish(groups, countdown=seconds))
            missed = [d.pk for d in deliveries if d.pk not in published]
            if missed:
                # The relay publishes these once they are due (it only takes rows with no publish on record).
                Delivery.objects.filter(pk__in=missed).update(published_at=None, updated_at=now)
        if dead:
            publish_dead_letters([(d.pk, d.channel, d.attempts, err) for d, err, _ in dead])
