"""The delivery pipeline a channel worker runs for a batch of delivery ids.

claim → re-check compliance → render → pick a provider (failover, breaker) → take rate-limit tokens → send the
batch concurrently → record every outcome in bulk. Each step is idempotent or guarded by the delivery's status,
so a message delivered twice by RabbitMQ (at-least-once) never makes a second send.
"""

from __future__ import annotations

import json
import logging
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from channels_app import guards
from channels_app.providers import registry
from channels_app.providers.base import OutboundMessage, ProviderError, SendResult
from config.celery import queue_name
from notifier import metrics
from notifier.db import RowLoader, bound_cursor, int_array, json_rows
from notifier.events import record_events
from notifier.logging import log_lines
from notifier.models import Campaign, DeadLetter, Delivery, Notification
from notifier.outbox import publish
from preferences.compliance import evaluate, suppressed_addresses
from preferences.digest import is_digest
from preferences.models import Recipient
from preferences.services import suppression_add
from templates_app.models import TemplateVersion
from templates_app.rendering import RenderError, render

_audit_log = logging.getLogger(__name__)

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


def claim(delivery_ids: Sequence[int]) -> list[int]:
    """Atomically move waiting deliveries to `sending`; return the ids this worker now owns.

    Only a delivery still waiting (queued or deferred, and due) can be claimed, or one whose worker died
    mid-send (`sending` past its lease). A second message for the same delivery therefore finds nothing.

    `id IN (SELECT unnest(…))`, not `id = ANY(…)` or a literal IN list: before the table has statistics (a new
    installation's first campaign) the planner estimates those at 0.5 % of the table per element and scans
    all of it; the semi-join probes the primary key whatever the statistics.
    """
    sql = """
        WITH claimed AS (
            UPDATE notifier_delivery
            SET status = 'sending', attempts = attempts + 1, claimed_at = now(), updated_at = now()
            WHERE id IN (SELECT unnest(%s::bigint[])) AND (
                (status IN ('queued', 'deferred') AND (not_before IS NULL OR not_before <= now() + interval '1 second')
                 AND reason NOT LIKE 'digest%%')
                OR (status = 'sending' AND claimed_at < now() - make_interval(secs => %s))
            )
            RETURNING id
        ), events AS (
            INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at) SELECT id, 'sending', '', now()
            FROM claimed
        )
        SELECT id FROM claimed
    """
    with bound_cursor() as cursor:
        # One statement, so no transaction block: the claim and its events commit together.
        cursor.execute(sql, [int_array(delivery_ids), settings.SENDING_LEASE_SECONDS])
        ids = [row[0] for row in cursor.fetchall()]
    return ids


_versions: dict[tuple[str, int], TemplateVersion] = {}


def _template_version(notification: Notification) -> TemplateVersion:
    """Return the (immutable) template version a notification was accepted with, cached per process."""
    key = (notification.template_key, notification.template_version or 0)
    version = _versions.get(key)
    if version is None:
        version = TemplateVersion.objects.select_related("template").get(
            template__key=notification.template_key, version=notification.template_version
        )
        if len(_versions) > 4096:
            _versions.clear()
        _versions[key] = version
    return version


def backoff_seconds(attempt: int, retry_after: float | None = None) -> float:
    """Return the delay before retry `attempt`: exponential with full jitter, never less than Retry-After."""
    cap = min(settings.RETRY_BACKOFF_MAX_SECONDS, settings.RETRY_BACKOFF_BASE_SECONDS * (2 ** max(attempt - 1, 0)))
    delay = random.uniform(settings.RETRY_BACKOFF_BASE_SECONDS / 2, max(cap, settings.RETRY_BACKOFF_BASE_SECONDS))
    return max(delay, retry_after or 0.0)


class _Outcomes:
    """Collects per-delivery outcomes of a batch and writes them with a few bulk statements."""

    def __init__(self, report: BatchReport) -> None:
        self.report = report
        self.now = timezone.now()
        self.updates: list[tuple[Delivery, dict[str, Any]]] = []
        self.events: list[tuple[int, str, str]] = []
        self.republish: dict[float, list[Delivery]] = defaultdict(list)
        self.dead: list[tuple[Delivery, str]] = []
        self.suppress: list[tuple[str, str, str]] = []

    def set(self, delivery: Delivery, status: str, detail: str = "", **fields: Any) -> None:
        self.updates.append((delivery, {"status": status, **fields}))
        self.events.append((delivery.pk, status, detail))
        self.report.outcomes[delivery.pk] = status

    def sent(
        self, delivery: Delivery, provider: str, result: SendResult, content: dict[str, Any], at: datetime
    ) -> None:
        fields: dict[str, Any] = {"provider": provider, "provider_message_id": result.provider_message_id}
        fields["sent_at"] = at  # when the provider accepted it, not when the batch started
        fields["last_error"] = ""
        if delivery.channel == "inapp":
            fields["content"] = content
        self.set(delivery, S.SENT, provider, **fields)
        self.report.sent += 1

    def suppressed(self, delivery: Delivery, reason: str) -> None:
        self.set(delivery, S.SUPPRESSED, reason, reason=reason)
        self.report.suppressed += 1

    def wait(self, delivery: Delivery, *, until: datetime | None, reason: str, uncount: bool = True) -> None:
        """Defer without spending an attempt; a short wait goes back to the broker as a delayed message."""
        fields: dict[str, Any] = {"reason": reason, "not_before": until}
        if uncount:
            fields["attempts"] = max(delivery.attempts - 1, 0)
        delay = (until - self.now).total_seconds() if until else None
        if delay is not None and delay <= settings.BROKER_DELAY_MAX_SECONDS:
            self.republish[max(delay, 0.0)].append(delivery)
            fields["published_at"] = self.now
        else:
            # Long waits (quiet hours, digests) stay in the database; the relay wakes them when due.
            fields["published_at"] = None
        self.set(delivery, S.DEFERRED, reason, **fields)
        self.report.deferred += 1

    def failed(self, delivery: Delivery, error: ProviderError | RenderError | str, provider: str = "") -> None:
        reason = getattr(error, "code", "") or type(error).__name__ if not isinstance(error, str) else error
        self.set(delivery, S.FAILED, str(error), reason=str(reason)[:255], last_error=str(error), provider=provider)
        self.report.failed += 1
        if isinstance(error, ProviderError) and error.suppress and delivery.address:
            self.suppress.append((delivery.channel, delivery.address, str(error.code or "invalid")))

    def retry(self, delivery: Delivery, error: ProviderError, provider: str) -> None:
        if delivery.attempts >= settings.DELIVERY_MAX_ATTEMPTS:
            self.set(
                delivery,
                S.FAILED,
                f"attempts exhausted: {error}",
                reason="attempts_exhausted",
                last_error=str(error),
                provider=provider,
            )
            self.dead.append((delivery, str(error)))
            self.report.failed += 1
            self.report.dead_lettered += 1
            return
        delay = backoff_seconds(delivery.attempts, error.retry_after)
        # An ambiguous failure (the request may have reached the provider) pins the retry to that provider.
        reason = f"{guards.AMBIGUOUS_PREFIX}{provider}" if error.maybe_sent else "retry"
        self.set(
            delivery,
            S.QUEUED,
            f"retry in {delay:.1f}s after: {error}" + (" (ambiguous: same provider only)" if error.maybe_sent else ""),
            reason=reason,
            last_error=str(error),
            provider=provider,
            not_before=self.now + timedelta(seconds=delay),
            published_at=self.now,
        )
        self.republish[delay].append(delivery)
        self.report.retried += 1

    def _log_outcomes(self) -> None:
        """Write one audit line per outcome: who (ids only), which channel and provider, what happened."""
        if not _audit_log.isEnabledFor(logging.INFO):
            return  # hundreds of lines per batch: not even built when nobody keeps them
        lines = []
        for delivery, fields in self.updates:
            if "status" not in fields:
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

    def _count_metrics(self) -> None:
        counts: dict[tuple[str, str, str], int] = defaultdict(int)
        for delivery, fields in self.updates:
            if "status" in fields:
                counts[(delivery.channel, fields.get("provider") or delivery.provider or "none", fields["status"])] += 1
        for (channel, provider, status), n in counts.items():
            metrics.count_deliveries(channel, provider, status, n)

    # The columns an outcome may change; every touched row is written with all of them in one statement.
    COLUMNS = (
        ("status", "text"),
        ("reason", "text"),
        ("provider", "text"),
        ("provider_message_id", "text"),
        ("attempts", "integer"),
        ("last_error", "text"),
        ("not_before", "timestamptz"),
        ("published_at", "timestamptz"),
        ("sent_at", "timestamptz"),
        ("template_version_id", "bigint"),
        ("content", "jsonb"),
    )

    def _write_rows(self) -> None:
        """Apply every outcome to its row with a single UPDATE … FROM json_array_elements(…), whatever the batch size.

        Outcomes differ per row (a provider message id each), so grouping rows by identical values would be
        one statement per delivery; one JSON parameter of per-row values keeps it one round trip.
        """
        rows: dict[int, Delivery] = {}
        for delivery, fields in self.updates:
            for name, value in fields.items():
                setattr(delivery, name, value)
            rows[delivery.pk] = delivery
        if not rows:
            return
        deliveries = list(rows.values())
        # A column with one value across the batch (status, provider, sent_at, …) travels as one parameter;
        # only the columns that differ per row (the provider's message id) travel in the rows.
        assignments: list[str] = []
        params: list[Any] = []
        varying: list[list[Any]] = []
        for name, kind in self.COLUMNS:
            values = [getattr(d, name) for d in deliveries]
            if kind == "jsonb":
                values = [json.dumps(v) if v is not None else None for v in values]
            cast = "text" if kind == "jsonb" else kind
            suffix = "::jsonb" if kind == "jsonb" else ""
            if all(v == values[0] for v in values):
                assignments.append(f"{name} = %s::{cast}{suffix}")
                params.append(values[0])
            else:
                assignments.append(f"{name} = (e->>{len(varying) + 1})::{cast}{suffix}")
                varying.append(values)
        sql = (
            f"UPDATE notifier_delivery AS d SET {', '.join(assignments)}, updated_at = %s"  # noqa: S608 - fixed names
            " FROM json_array_elements(%s::json) AS e WHERE d.id = (e->>0)::bigint"
        )
        with bound_cursor() as cursor:
            cursor.execute(sql, [*params, self.now, json_rows(zip([d.pk for d in deliveries], *varying, strict=True))])

    def flush(self) -> None:
        """Write every outcome, then publish the retries and dead letters (after commit)."""
        with transaction.atomic():
            self._write_rows()
            record_events(self.events, at=self.now)
            # In the same transaction as the failure: once a delivery reads failed, its address is suppressed.
            for channel, address, code in self.suppress:
                suppression_add(channel=channel, address=address, source="invalid", reason=f"provider error {code}")
            self._count_metrics()
            DeadLetter.objects.bulk_create(
                [
                    DeadLetter(
                        delivery=d,
                        channel=d.channel,
                        queue=f"dead.{d.channel}",
                        reason="attempts_exhausted",
                        attempts=d.attempts,
                        last_error=err[:4000],
                    )
                    for d, err in self.dead
                ]
            )
        self._log_outcomes()
        for delay, deliveries in self.republish.items():
            groups: dict[str, list[int]] = defaultdict(list)
            for d in deliveries:
                groups[queue_name(d.channel, d.priority)].append(d.pk)
            published = set(publish(groups, countdown=delay))
            missed = [d.pk for d in deliveries if d.pk not in published]
            if missed:
                # The relay publishes these once they are due (it only takes rows with no publish on record).
                Delivery.objects.filter(pk__in=missed).update(published_at=None)
        if self.dead:
            from channels_app.deadletter import publish_dead_letters

            publish_dead_letters([(d.pk, d.channel, d.attempts, err) for d, err in self.dead])


# Timestamps the pipeline never reads stay in the database: parsing them was a tenth of a batch's time.
_DELIVERIES = RowLoader(Delivery, skip=("created_at", "updated_at", "claimed_at", "read_at"))
_RECIPIENTS = RowLoader(Recipient, skip=("created_at", "updated_at"))
_LOAD_SQL = (
    f"SELECT {_DELIVERIES.columns('d')}, {_RECIPIENTS.columns('r')} FROM notifier_delivery d"  # noqa: S608
    " JOIN preferences_recipient r ON r.id = d.recipient_id WHERE d.id IN (SELECT unnest(%s::bigint[]))"
)


def _load(ids: Sequence[int]) -> list[Delivery]:
    """Load claimed deliveries with their recipients (as select_related would), in one query."""
    with bound_cursor() as cursor:
        cursor.execute(_LOAD_SQL, [int_array(ids)])
        rows = cursor.fetchall()
    width = _DELIVERIES.width
    deliveries = []
    for row in rows:
        delivery = _DELIVERIES.build(row[:width])
        delivery._state.fields_cache["recipient"] = _RECIPIENTS.build(row[width:])
        deliveries.append(delivery)
    return deliveries


def deliver(delivery_ids: Sequence[int]) -> BatchReport:
    """Claim and send a batch of deliveries; return what happened to each."""
    report = BatchReport()
    ids = claim(delivery_ids)
    report.claimed = len(ids)
    if not ids:
        return report
    deliveries = _load(ids)
    # A batch usually belongs to one notification: load it (with client and campaign) once, not per row.
    notifications = Notification.objects.select_related("client", "campaign").in_bulk(
        {d.notification_id for d in deliveries}
    )
    for delivery in deliveries:
        delivery.notification = notifications[delivery.notification_id]
    out = _Outcomes(report)
    sendable = _recheck_compliance(deliveries, out)
    by_channel: dict[str, list[tuple[Delivery, OutboundMessage]]] = defaultdict(list)
    for delivery in sendable:
        message = _build_message(delivery, out)
        if message is not None:
            by_channel[delivery.channel].append((delivery, message))
    for channel, items in by_channel.items():
        _send_channel(channel, items, out)
    out.flush()
    return report


def _recheck_compliance(deliveries: list[Delivery], out: _Outcomes) -> list[Delivery]:
    """Apply preferences, opt-outs, quiet hours and the suppression list again: they may have changed."""
    dead = suppressed_addresses([(d.channel, d.address) for d in deliveries if d.address])
    sendable = []
    for d in deliveries:
        campaign = d.notification.campaign
        if d.notification.status == Notification.Status.CANCELLED or (
            campaign is not None and campaign.status == Campaign.Status.CANCELLED
        ):
            out.set(d, S.CANCELLED, "cancelled")
            continue
        if campaign is not None and campaign.status == Campaign.Status.PAUSED:
            # Held in the database until the campaign is resumed (resume releases reason campaign_paused).
            out.wait(d, until=out.now + timedelta(days=36500), reason="campaign_paused")
            continue
        verdict = evaluate(
            recipient=d.recipient,
            category=d.notification.category,
            channel=d.channel,
            address=d.address,
            now=out.now,
            suppressed=(d.channel, d.address) in dead,
            # A digest is never folded into another digest (quiet hours still hold it).
            digestible=not is_digest(d.notification),
        )
        if verdict.action == "send":
            sendable.append(d)
        elif verdict.action == "suppress":
            out.suppressed(d, verdict.reason)
        elif verdict.action == "digest":
            out.wait(d, until=None, reason=verdict.reason or "digest")
        else:
            out.wait(d, until=verdict.until, reason=verdict.reason or "quiet_hours")
    return sendable


_render_cache: dict[tuple[Any, ...], Any] = {}


def _build_message(delivery: Delivery, out: _Outcomes) -> OutboundMessage | None:
    """Render the delivery's template (once per notification, channel and locale in a batch)."""
    n = delivery.notification
    try:
        version = _template_version(n)
        locale = n.locale or delivery.recipient.locale or version.template.default_locale
        cache_key = (n.pk, delivery.channel, locale)
        rendered = _render_cache.get(cache_key)
        if rendered is None:
            rendered = render(version, channel=delivery.channel, locale=locale, payload=n.payload)
            if len(_render_cache) > 10_000:
                _render_cache.clear()
            _render_cache[cache_key] = rendered
    except (RenderError, TemplateVersion.DoesNotExist) as exc:
        out.failed(delivery, f"render_error: {exc}")
        return None
    delivery.template_version_id = version.pk
    out.updates.append((delivery, {"template_version_id": version.pk}))
    meta: dict[str, Any] = {"attempt": delivery.attempts, "webhook_secret": n.client.webhook_secret}
    meta.update(guards.message_meta(delivery))
    return OutboundMessage(
        delivery_id=delivery.pk,
        channel=delivery.channel,
        address=delivery.address,
        content=rendered.parts,
        idempotency_key=f"dlv_{delivery.pk}",
        category=n.category,
        priority=delivery.priority,
        meta=meta,
    )


def _send_channel(channel: str, items: list[tuple[Delivery, OutboundMessage]], out: _Outcomes) -> None:
    """Send one channel's part of the batch through its providers, honouring failover, breakers and limits."""
    by_provider: dict[str, list[tuple[Delivery, OutboundMessage]]] = defaultdict(list)
    for delivery, message in items:
        provider = guards.pick_provider(channel, delivery, out, want=len(items))
        if provider is not None:
            by_provider[provider].append((delivery, message))
    for name, group in by_provider.items():
        granted, wait = guards.take_tokens(name, group, out)
        waiting = [delivery for delivery, _ in group[granted:]]
        for delivery, delay in zip(waiting, guards.spread_waits(name, wait, len(waiting)), strict=True):
            out.wait(delivery, until=out.now + timedelta(seconds=delay), reason=f"rate_limited:{name}")
        group = group[:granted]
        if not group:
            continue
        provider = registry.get_provider(name)
        outcomes = guards.timed_send(provider, [m for _, m in group])
        answered_at = timezone.now()
        for (delivery, message), outcome in zip(group, outcomes, strict=True):
            if isinstance(outcome, SendResult):
                out.sent(delivery, name, outcome, message.content, at=answered_at)
            elif outcome.retriable:
                out.retry(delivery, outcome, name)
            else:
                out.failed(delivery, outcome, name)
        guards.note_outcomes(name, outcomes)
