"""The status event sender: POST each endpoint's pending events, in order, signed, retried for a day.

Runs on the event workers (queue `events`), never on the send path. One endpoint is sent by one sender at a
time (a Redis lease per endpoint), so its events arrive in order; while its oldest pending event keeps
failing, the whole endpoint backs off and the worker moves on to other endpoints: a slow or dead receiver
stalls only its own events. Requests go through the webhook adapter (SSRF guard, timeouts, Standard Webhooks
signature, and whatever bound the adapter puts on a call's total time); events older than
EVENT_RETRY_WINDOW_SECONDS are given up with a record (an EventAttempt).
"""

from __future__ import annotations

import functools
import math
import random
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from channels_app.providers.base import OutboundMessage, ProviderError
from channels_app.providers.webhook import WebhookProvider
from core.redis_guard import get_redis, rkey
from notifier.statusevents.models import EventAttempt, EventEndpoint, StatusEvent
from notifier.statusevents.record import status_events_wake
from notifier.statusevents.selectors import endpoints_due

# Compare-and-delete / compare-and-extend: only the holder of the lease may release or renew it.
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"


@functools.cache
def _adapter() -> WebhookProvider:
    """Return the process's webhook adapter (its pooled, SSRF-guarded session), built from WEBHOOK_* settings."""
    return WebhookProvider.from_settings()


def event_id(pk: int) -> str:
    """Return the public id of a status event (the `webhook-id` of its request, stable across retries)."""
    return f"evt_{pk}"


def event_body(event: StatusEvent) -> dict[str, Any]:
    """Return one event as the receiver sees it (docs/reach.md, "What arrives")."""
    return {"id": event_id(event.pk), "type": event.type, "timestamp": event.at.isoformat(), "data": event.data}


def request_payload(events: Sequence[StatusEvent], max_batch: int) -> tuple[str, dict[str, Any]]:
    """Return the message id and JSON payload of one request: the event itself, or a batch of them."""
    if max_batch <= 1:
        return event_id(events[0].pk), event_body(events[0])
    # A batch's id names its first and last event; each event inside keeps its own id to deduplicate on.
    payload = {"type": "batch", "timestamp": events[-1].at.isoformat(), "data": [event_body(e) for e in events]}
    return f"evb_{events[0].pk}_{events[-1].pk}", payload


def backoff(failures: int) -> float:
    """Return the wait after the endpoint's `failures`-th failure in a row: exponential, full jitter.

    The curve of the deliveries' retries (channels_app backoff_seconds) on the EVENT_RETRY_* settings.
    """
    base, ceiling = settings.EVENT_RETRY_BASE_SECONDS, settings.EVENT_RETRY_MAX_SECONDS
    return random.uniform(base / 2, max(base, min(ceiling, base * 2 ** max(failures - 1, 0))))


def status_events_send(*, endpoint_id: int) -> int:
    """Send an endpoint's due pending events until none are left, it fails, or the run's budget is spent.

    Returns how many events were delivered. A second sender for the same endpoint returns at once: the one
    holding the lease re-checks for new events after releasing it, so nothing woken in between is missed.
    """
    redis = get_redis()
    # New events from now on must wake a sender again (the wake is coalesced on this key).
    redis.delete(rkey("evwake", endpoint_id))
    lease_key = rkey("evsend", endpoint_id)
    lease_ms = int(settings.EVENT_SENDER_LEASE_SECONDS * 1000)
    deadline = time.monotonic() + settings.EVENT_SENDER_RUN_SECONDS
    delivered = 0
    while True:
        token = uuid.uuid4().hex
        if not redis.set(lease_key, token, nx=True, px=lease_ms):
            return delivered
        try:
            state, n = _drain(
                endpoint_id, deadline, renew=functools.partial(redis.eval, _RENEW, 1, lease_key, token, lease_ms)
            )
            delivered += n
        finally:
            redis.eval(_RELEASE, 1, lease_key, token)
        if state == "budget":
            # Let other endpoints have the worker; carry on in a fresh task.
            status_events_wake(endpoint_ids=[endpoint_id], force=True)
            return delivered
        if state != "empty" or not _due(endpoint_id):
            return delivered


def _due(endpoint_id: int) -> bool:
    return StatusEvent.objects.filter(endpoint_id=endpoint_id, state=StatusEvent.State.PENDING).exists()


def _drain(endpoint_id: int, deadline: float, renew: Callable[[], object]) -> tuple[str, int]:
    """Send batches of the endpoint's pending events in order; return why it stopped and how many went."""
    delivered = 0
    while True:
        if time.monotonic() > deadline:
            return "budget", delivered
        renew()
        endpoint = EventEndpoint.objects.filter(pk=endpoint_id, is_active=True).first()
        if endpoint is None:
            return "gone", delivered
        now = timezone.now()
        if endpoint.retry_at is not None and endpoint.retry_at > now:
            wait = (endpoint.retry_at - now).total_seconds()
            if wait <= 1.0:
                # Delayed messages count whole seconds: a short backoff is cheaper to sleep here.
                time.sleep(wait)
                continue
            # Backing off: a delayed wake (and the sweep) comes back at retry_at; the worker serves others. One
            # delayed wake per backoff, however many new events wake the endpoint while it waits.
            if get_redis().set(rkey("evretry", endpoint_id), "1", nx=True, px=int(wait * 1000)):
                status_events_wake(endpoint_ids=[endpoint_id], countdown=math.ceil(wait))
            return "waiting", delivered
        events = list(
            StatusEvent.objects.filter(endpoint_id=endpoint_id, state=StatusEvent.State.PENDING)
            .only("id", "type", "data", "at")
            .order_by("id")[: endpoint.max_batch]
        )
        if not events:
            return "empty", delivered
        if _post(endpoint, events):
            delivered += len(events)


def _post(endpoint: EventEndpoint, events: list[StatusEvent]) -> bool:
    """POST one request of events and record the attempt; on failure back the endpoint off, give up old events.

    The request is an ordinary webhook message for the webhook adapter's `send`: the same SSRF guard (address
    checked and pinned, no redirects), timeouts and bounded answer as the webhook channel, signed per Standard
    Webhooks with the endpoint's secret, `webhook-id` being the event's (or batch's) stable id.
    """
    msg_id, payload = request_payload(events, endpoint.max_batch)
    message = OutboundMessage(
        delivery_id=events[0].pk,
        channel="webhook",
        address=endpoint.url,
        content={"body": payload},
        idempotency_key=msg_id,
        meta={"webhook_secret": endpoint.secret},
    )
    started = time.monotonic()
    status: int | None = None
    error = ""
    try:
        _adapter().send(message)
        status = 200
    except ProviderError as exc:
        error = str(exc)
        # The adapter names an HTTP answer "http_<status>"; anything else got no answer (refused, timed out).
        if exc.code.startswith("http_") and exc.code[5:].isdigit():
            status = int(exc.code[5:])
    ok = status is not None and 200 <= status < 300
    now = timezone.now()
    ids = [e.pk for e in events]
    given_up = 0
    with transaction.atomic():
        pending = StatusEvent.objects.filter(pk__in=ids, state=StatusEvent.State.PENDING)
        if ok:
            pending.update(state=StatusEvent.State.DELIVERED, delivered_at=now, attempts=F("attempts") + 1)
            if endpoint.failures or endpoint.retry_at:
                EventEndpoint.objects.filter(pk=endpoint.pk).update(failures=0, retry_at=None)
        else:
            pending.update(attempts=F("attempts") + 1)
            # Past the retry window: stop trying, keep the record (the attempt row says how many).
            cutoff = now - timedelta(seconds=settings.EVENT_RETRY_WINDOW_SECONDS)
            given_up = StatusEvent.objects.filter(
                endpoint_id=endpoint.pk, state=StatusEvent.State.PENDING, at__lt=cutoff
            ).update(state=StatusEvent.State.GIVEN_UP)
            failures = endpoint.failures + 1
            delay = backoff(failures)
            EventEndpoint.objects.filter(pk=endpoint.pk).update(
                failures=failures, retry_at=now + timedelta(seconds=delay)
            )
        EventAttempt.objects.create(
            endpoint_id=endpoint.pk,
            first_event_id=ids[0],
            last_event_id=ids[-1],
            events=len(ids),
            ok=ok,
            given_up=given_up,
            status_code=status,
            error=error[:512],
            duration_ms=int((time.monotonic() - started) * 1000),
            at=now,
        )
    return ok


def status_events_sweep() -> int:
    """Wake every endpoint with due pending events (a lost wake, a worker that died mid-run); return how many."""
    ids = endpoints_due()
    status_events_wake(endpoint_ids=ids)
    return len(ids)
