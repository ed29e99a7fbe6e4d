"""The delivery pipeline a channel worker runs for a batch of delivery ids.

claim → re-check compliance → render → pick a provider (failover, breaker) → take rate-limit tokens → send the
batch concurrently → write each answer as it arrives (channels_app.outcomes). Each step is idempotent or guarded
by the delivery's status, so a message delivered twice by RabbitMQ (at-least-once) never makes a second send.
A batch is how work travels, a delivery is what fails: anything raised for one delivery fails it alone.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from channels_app import guards, renderings
from channels_app.outcomes import BatchReport, DbClock, Outcomes, backoff_seconds, describe_exception
from channels_app.providers import registry
from channels_app.providers.base import ConfigurationError, OutboundMessage, Outcome, RetriableError
from channels_app.sms_fit import sms_fit
from core import config_cache
from notifier.campaigns.models import Campaign
from notifier.campaigns.selectors import attach_campaigns
from notifier.deliveries import frequency
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.queries import deliveries_load_for_send, notifications_load_for_send
from notifier.deliveries.status import Claim, deliveries_claim, deliveries_renew_leases
from notifier.dispatch import shares
from notifier.dispatch.digest import is_digest
from notifier.statusevents.selectors import has_event_endpoint
from notifier.tracking.services import decorate as tracking_decorate
from preferences.compliance import evaluate, suppressed_addresses
from preferences.emails import personalize, uses_preferences_url
from projects.scoping import owner_id, owner_scope
from templates_app import layouts
from templates_app.models import TemplateVersion
from templates_app.rendering import RenderError, RenderRequest, header_value, render_many
from templates_app.selectors import template_version_exact

logger = logging.getLogger(__name__)

S = Delivery.Status
# Re-exported: callers read the batch report and the backoff curve from here.
__all__ = ["BatchReport", "backoff_seconds", "deliver", "heartbeat"]


def _template_version(notification: Notification) -> TemplateVersion:
    """Return the (immutable) template version a notification was accepted with, of its own environment."""
    version = template_version_exact(
        environment_id=owner_id(notification), key=notification.template_key, version=notification.template_version
    )
    if version is None:
        # The render error the delivery fails with names what is missing.
        raise TemplateVersion.DoesNotExist(
            f"template '{notification.template_key}' has no version {notification.template_version}"
        )
    return version


class _Heartbeat:
    """Renews the lease (claimed_at) of every delivery this process is sending, from one thread per process.

    A running batch is therefore never taken by another worker, however long it runs; when the process dies
    the renewals stop and the lease runs out, which is what hands its deliveries to another worker.
    """

    def __init__(self) -> None:
        self._owned: dict[int, int] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def interval(self) -> float:
        """Return the seconds between renewals."""
        return settings.SENDING_HEARTBEAT_SECONDS or settings.SENDING_LEASE_SECONDS / 3

    def hold(self, ids: Sequence[int]) -> None:
        """Start renewing the lease of `ids`."""
        with self._lock:
            for i in ids:
                self._owned[i] = self._owned.get(i, 0) + 1
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                # Started in the process that sends (a forked pool child), never inherited from a parent.
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)
                self._thread.start()

    def release(self, ids: Sequence[int]) -> None:
        """Stop renewing the lease of `ids` (their outcome is written, or the batch is over)."""
        with self._lock:
            for i in ids:
                n = self._owned.get(i, 0) - 1
                if n > 0:
                    self._owned[i] = n
                else:
                    self._owned.pop(i, None)

    def owned(self) -> list[int]:
        """Return the ids whose lease this process renews."""
        with self._lock:
            return list(self._owned)

    def beat(self) -> int:
        """Renew the lease of every owned delivery still `sending`; return how many were renewed."""
        ids = self.owned()
        if not ids:
            return 0
        return deliveries_renew_leases(ids)

    def _run(self) -> None:
        pause = self.interval()
        while True:
            time.sleep(pause)
            pause = self.interval()
            try:
                self.beat()
            except Exception as exc:  # the database may be away for a while; the next beat tries again
                logger.warning("lease heartbeat failed: %s", type(exc).__name__)
                connection.close()
                # Soon, not a third of a lease later: once the database answers again the lease is renewed
                # within a second, before the relay (every OUTBOX_RELAY_INTERVAL_SECONDS) finds it expired.
                pause = min(pause, 1.0)
            if not self.owned():
                # Idle: drop this thread's connection until there is something to renew again.
                connection.close()


heartbeat = _Heartbeat()


def deliver(delivery_ids: Sequence[int]) -> BatchReport:
    """Claim and send a batch of deliveries; return what happened to each.

    Outcomes are written as answers arrive (see channels_app.outcomes); anything raised for one delivery
    fails that delivery alone; the lease of what is still in flight is renewed while the batch runs.
    """
    report = BatchReport()
    claimed = deliveries_claim(delivery_ids, lease_seconds=settings.SENDING_LEASE_SECONDS)
    report.claimed = len(claimed.ids)
    if not claimed.ids:
        return report
    out = Outcomes(report, clock=DbClock(claimed.db_now))
    heartbeat.hold(claimed.ids)
    try:
        # The batch's cached lookups (templates, event endpoints, clients) share one read of the generation, as
        # a request's do: a change made meanwhile is seen by the next batch.
        with config_cache.one_generation():
            _deliver_claimed(claimed, out)
        out.flush()
    finally:
        heartbeat.release(claimed.ids)
    return report


def _deliver_claimed(claimed: Claim, out: Outcomes) -> None:
    deliveries = deliveries_load_for_send(claimed.ids)
    # A batch usually belongs to one notification: load it (with client and campaign) once, not per row.
    notifications = notifications_load_for_send({d.notification_id for d in deliveries})
    attach_campaigns(list(notifications.values()))
    for delivery in deliveries:
        delivery.notification = notifications[delivery.notification_id]
    # Status events and inbox notifications only where someone listens: decided once for the batch.
    out.reach = any(d.channel == "inapp" for d in deliveries) or any(
        has_event_endpoint(client_id) for client_id in {n.client_id for n in notifications.values()}
    )
    live = []
    for delivery in deliveries:
        if delivery.pk in claimed.reclaimed and delivery.attempts > settings.DELIVERY_MAX_ATTEMPTS:
            # Its worker died (or its lease ran out) on every attempt: whatever it is, it is not sent again.
            detail = f"lease expired on each of {delivery.attempts - 1} attempts"
            out.exhausted(delivery, detail, last_error=delivery.last_error or detail)
        else:
            live.append(delivery)
    try:
        sendable = _recheck_compliance(live, out)
        rendered_for = _prerender(sendable)
        by_channel: dict[str, list[tuple[Delivery, OutboundMessage]]] = defaultdict(list)
        for delivery in sendable:
            message = _build_message(delivery, out, rendered_for)
            if message is not None:
                by_channel[delivery.channel].append((delivery, message))
        for channel, items in by_channel.items():
            _send_channel(channel, items, out)
    except (OperationalError, InterfaceError):
        raise  # the database went away: the task retries (what was answered is already written)
    except Exception as exc:
        # Something outside any one delivery broke (a bug in the pipeline itself). What has no outcome yet is
        # retried later as an attempt, so even this cannot loop past DELIVERY_MAX_ATTEMPTS.
        logger.exception("send batch failed outside any delivery")
        error = RetriableError(describe_exception(exc), code="batch_error")
        for delivery in live:
            if delivery.pk not in out.report.outcomes:
                out.retry(delivery, error, delivery.provider)


def _recheck_compliance(deliveries: list[Delivery], out: Outcomes) -> list[Delivery]:
    """Apply preferences, opt-outs, quiet hours and the suppression list again: they may have changed."""
    # Each environment's suppression list (with the installation-wide entries): one query per environment in
    # the batch, one in the common case.
    pairs_of: dict[int, list[tuple[str, str]]] = {}
    for d in deliveries:
        if d.address:
            pairs_of.setdefault(owner_id(d), []).append((d.channel, d.address))
    dead = {
        (environment_id, channel, address)
        for environment_id, pairs in pairs_of.items()
        for channel, address in suppressed_addresses(pairs, environment_id=environment_id)
    }
    sendable = []
    now = out.now
    for d in deliveries:
        try:
            campaign = d.notification.campaign
            if d.notification.status == Notification.Status.CANCELLED or (
                campaign is not None and campaign.status == Campaign.Status.CANCELLED
            ):
                out.cancelled(d)
                continue
            if campaign is not None and campaign.status == Campaign.Status.PAUSED:
                # Held in the database until the campaign is resumed (resume releases reason campaign_paused).
                out.wait(d, until=now + timedelta(days=36500), reason="campaign_paused")
                continue
            verdict = evaluate(
                recipient=d.recipient,
                category=d.notification.category,
                channel=d.channel,
                address=d.address,
                now=now,
                suppressed=(d.environment_id, d.channel, d.address) in dead,
                # A digest is never folded into another digest (quiet hours still hold it).
                digestible=not is_digest(d.notification),
            )
        except Exception as exc:  # a bad preference row fails its delivery, not the batch
            out.poison(d, exc, stage="compliance")
            continue
        if verdict.action == "send":
            sendable.append(d)
        elif verdict.action == "suppress":
            out.suppressed(d, verdict.reason)
        elif verdict.action == "digest":
            out.wait(d, until=None, reason=verdict.reason or "digest")
        else:
            out.wait(d, until=verdict.until, reason=verdict.reason or "quiet_hours")
    # Smarter delivery hook (notifier/deliveries/frequency.py): the per-recipient cap, checked again right before
    # sending.
    return frequency.recheck_on_worker(sendable, out.suppressed)


# What a batch's deliveries render to, by (notification id, channel, locale): a rendering, its RenderError, or
# absent (not rendered in advance: _build_message renders it).
Rendered = dict[tuple[Any, ...], Any]


def _prerender(deliveries: list[Delivery]) -> Rendered:
    """Render each (notification, channel, locale) of a batch once, all in one call, before building messages.

    Renderings are kept by the process across batches under what they depend on (channels_app/renderings.py),
    so deliveries of different notifications with the same template, payload and locale (a topic workflow's
    runs) render once. Templates outside the bounded subset render in a render child (templates_app.isolation):
    asking for a batch's renderings together costs one round trip, not one per notification. A rendering that
    fails is kept as its error, so every delivery that shares it fails with it at once instead of rendering
    again (a template over its time budget would otherwise hold the worker for each of them). Should this
    batch-wide step fail in a way no rendering explains, each delivery renders on its own in _build_message, so
    one bad delivery still costs only itself.
    """
    try:
        return _prerender_batch(deliveries)
    except Exception:
        logger.exception("rendering a batch at once failed; rendering per delivery")
        return {}


def _prerender_batch(deliveries: list[Delivery]) -> Rendered:
    batch: Rendered = {}
    kept_as: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # (notification, channel, locale) -> the process's key
    wanted: dict[tuple[Any, ...], RenderRequest] = {}  # the process's key -> what to render
    shared = renderings.shared()
    for delivery in deliveries:
        n = delivery.notification
        try:
            version = _template_version(n)
        except TemplateVersion.DoesNotExist:
            continue  # _build_message fails the delivery with the reason
        locale = n.locale or delivery.recipient.locale or version.template.default_locale
        key = (n.pk, delivery.channel, locale)
        if key in batch or key in kept_as:
            continue
        process_key = renderings.key(
            notification_id=n.pk,
            version_id=version.pk,
            channel=delivery.channel,
            locale=locale,
            payload=n.payload,
            shared=shared,
        )
        kept = renderings.get(process_key)
        if kept is not None:
            batch[key] = kept
            continue
        kept_as[key] = process_key
        wanted.setdefault(process_key, (version, delivery.channel, locale, n.payload))
    if not wanted:
        return batch
    started = time.monotonic()
    for process_key, outcome in zip(wanted, render_many(list(wanted.values())), strict=True):
        if outcome.rendered is not None:
            version, channel, _, payload = wanted[process_key]
            try:
                # The email's layout is looked up by its key: the template's environment's (see _build_message).
                with owner_scope(owner_id(version.template)):
                    rendered = layouts.apply(version, outcome.rendered, channel=channel, payload=payload)
            except RenderError as exc:
                renderings.put(process_key, exc)
                continue
            renderings.put(process_key, (rendered, uses_preferences_url(rendered.parts, rendered.link_marker)))
        elif outcome.error is not None and outcome.error.code != "renderer_busy":  # busy: tried again later
            renderings.put(process_key, outcome.error)
    for key, process_key in kept_as.items():
        kept = renderings.get(process_key)
        if kept is not None:
            batch[key] = kept
    _record_render_cost(deliveries, wanted, time.monotonic() - started)
    return batch


def _record_render_cost(deliveries: list[Delivery], wanted: dict[tuple[Any, ...], RenderRequest], spent: float) -> None:
    """Tell fair shares what a delivery of each template rendered in this batch cost: its renderings' time over
    the batch's deliveries of it (a rendering shared by many deliveries costs each of them a sliver).

    A flow's sends are charged for it (notifier/dispatch/shares.py, `units_per_delivery`), so a project whose
    templates render slowly takes its share of the send workers' time, not only of the provider's rate.
    """
    each = spent / len(wanted)
    seconds: defaultdict[tuple[int, str], float] = defaultdict(float)
    for version, _, _, _ in wanted.values():
        seconds[(owner_id(version.template), version.template.key)] += each
    if max(seconds.values()) < shares.RENDER_COST_FLOOR_SECONDS and not shares.render_costs_written():
        return  # fast templates, none of them slow before: nothing to tell
    used = Counter((owner_id(d.notification), d.notification.template_key) for d in deliveries)
    shares.render_cost_record({name: total / max(1, used[name]) for name, total in seconds.items()})


def _build_message(delivery: Delivery, out: Outcomes, rendered_for: Rendered) -> OutboundMessage | None:
    """Render the delivery's template (once per notification, channel and locale in a batch) and build its message.

    `rendered_for` holds the batch's renderings made in advance (_prerender); what it lacks is rendered here
    and added. Anything raised here fails this delivery alone: a render error as `render_error`, anything else
    as poison.
    """
    n = delivery.notification
    try:
        version = _template_version(n)
        locale = n.locale or delivery.recipient.locale or version.template.default_locale
        cache_key = (n.pk, delivery.channel, locale)
        cached = rendered_for.get(cache_key)
        if isinstance(cached, RenderError):  # a fresh exception per delivery: re-raising one grows its traceback
            raise RenderError(cached.message, variable=cached.variable, path=cached.path, code=cached.code)
        if cached is None:
            # A layout is named by its key, which each environment has its own of; a worker sends many
            # environments' deliveries, so the lookup is the template's environment's, not whatever is first.
            with owner_scope(owner_id(version.template)):
                rendered = layouts.render(version, channel=delivery.channel, locale=locale, payload=n.payload)
            # Checked once per render, not per delivery: most templates never use {{ preferences_url }}.
            cached = (rendered, uses_preferences_url(rendered.parts, rendered.link_marker))
            rendered_for[cache_key] = cached
        rendered, personal = cached
        meta: dict[str, Any] = {
            "attempt": delivery.attempts,
            "webhook_secret": n.client.webhook_secret,
            # Whose message it is: the sandbox records it, so a client lists only its own sandbox messages.
            "client_id": n.client_id,
        }
        meta.update(guards.message_meta(delivery))
        meta.update(guards.sender_meta(delivery))
        for name in ("from_email", "reply_to"):
            if isinstance(meta.get(name), str):
                meta[name] = header_value(meta[name])  # sender names become header lines too
        content = rendered.parts
        # SMS that fits (channels_app/sms_fit.py): encoding and segments on the row; too long fails before any provider.
        sms_fields, too_long = sms_fit(delivery.channel, content)
        if sms_fields:
            out.note(delivery, **sms_fields)
        if too_long is not None:
            out.failed(delivery, too_long)
            return None
        # Smarter delivery hook (notifier/tracking): signed links and an open pixel where the category tracks;
        # before the footer below, so the unsubscribe and preference links are never rewritten.
        content = tracking_decorate(delivery, content)
        if personal or "preferences_url" in meta:
            content = personalize(
                content,
                preferences_url=meta.get("preferences_url") or guards.recipient_preferences_url(delivery),
                unsubscribe_url=meta.get("list_unsubscribe"),
                locale=locale,
                # A template that places the link itself owns its footer.
                footer="preferences_url" in meta and not personal,
                marker=rendered.link_marker if personal else "",
            )
        message = OutboundMessage(
            delivery_id=delivery.pk,
            channel=delivery.channel,
            address=delivery.address,
            content=content,
            idempotency_key=f"dlv_{delivery.pk}",
            category=n.category,
            priority=delivery.priority,
            meta=meta,
        )
    except (RenderError, TemplateVersion.DoesNotExist) as exc:
        if isinstance(exc, RenderError) and exc.code == "renderer_busy":
            # Every render child of this process was busy: not the template's fault, so another attempt later.
            out.retry(delivery, RetriableError(exc.message, code="renderer_busy"), delivery.provider)
            return None
        # A broken template budget fails with reason template_budget (its code); other errors as render_error.
        budget = isinstance(exc, RenderError) and exc.code == "template_budget"
        out.failed(delivery, exc if isinstance(exc, RenderError) and budget else f"render_error: {exc}")
        return None
    except Exception as exc:
        out.poison(delivery, exc, stage="render")
        return None
    delivery.template_version_id = version.pk
    out.note(delivery, template_version_id=version.pk)
    return message


def _send_channel(channel: str, items: list[tuple[Delivery, OutboundMessage]], out: Outcomes) -> None:
    """Send one channel's part of the batch through its providers, honouring failover, breakers and limits."""
    by_provider: dict[str, list[tuple[Delivery, OutboundMessage]]] = defaultdict(list)
    for delivery, message in items:
        provider = guards.pick_provider(channel, delivery, out, want=len(items))
        if provider is not None:
            by_provider[provider].append((delivery, message))
    for name, group in by_provider.items():
        granted, wait = guards.take_tokens(name, group, out)
        waiting = [delivery for delivery, _ in group[granted:]]
        now = out.now
        for delivery, delay in zip(waiting, guards.spread_waits(name, wait, len(waiting)), strict=True):
            out.wait(delivery, until=now + timedelta(seconds=delay), reason=f"rate_limited:{name}")
        group = group[:granted]
        if group:
            _send_group(name, group, out)


def _send_group(name: str, group: list[tuple[Delivery, OutboundMessage]], out: Outcomes) -> None:
    """Send one provider's part of a batch and write the answers as they arrive.

    Answers are written in groups: whatever arrived since the last write, once it is at least half the window
    or OUTCOME_FLUSH_INTERVAL_SECONDS have passed. The window (the provider's calls in flight, or
    OUTCOME_FLUSH_MAX) is taken before each call and given back once its answer is written, so calls in flight
    plus answers not yet written never exceed it: a worker killed mid-batch repeats at most that many, always
    to the same provider with the same idempotency key. A provider with a batch API answers a chunk in one call;
    the chunk is one group. A fast provider therefore costs a few writes per batch, a slow one a write per
    interval, and neither waits for the other's pace.
    """
    try:
        provider = registry.get_provider(name)
    except ConfigurationError as exc:
        # An account that cannot be built (a missing credential): only the deliveries that use it pay, retried
        # with backoff like any fault an operator fixes; the rest of the batch goes on.
        logger.error("provider '%s' cannot be built: %s", name, exc)
        for delivery, _ in group:
            out.retry(delivery, RetriableError(str(exc), code="provider_config"), "")
        return
    limit = settings.OUTCOME_FLUSH_MAX or provider.max_concurrency
    window = threading.Semaphore(limit)
    interval = settings.OUTCOME_FLUSH_INTERVAL_SECONDS
    # Below this a write waits for more answers (or the interval): the calls still in flight fill the rest.
    least = max(1, limit // 2)
    answered: list[Any] = []
    done: list[int] = []
    last_flush = time.monotonic()
    for index, outcome in guards.timed_stream(provider, [m for _, m in group], window, name=name):
        if outcome is None:  # every answer that had arrived is in `answered`
            if answered and (len(answered) >= least or time.monotonic() - last_flush >= interval):
                _flush_answers(name, answered, done, out, window)
                answered, done, last_flush = [], [], time.monotonic()
            continue
        delivery, message = group[index]
        out.answer(delivery, name, outcome, message.content)
        answered.append(outcome)
        done.append(delivery.pk)
    _flush_answers(name, answered, done, out, window)


def _flush_answers(
    name: str, answered: list[Outcome], done: list[int], out: Outcomes, window: threading.Semaphore
) -> None:
    """Write a group of answers, give their window back, stop renewing their leases, tell the breaker."""
    if not answered:
        return
    out.flush()
    for _ in answered:
        window.release()
    heartbeat.release(done)
    guards.note_outcomes(name, answered)
