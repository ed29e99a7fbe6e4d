"""What stands between the pipeline and a provider: failover choice, circuit breaker, shared rate limit.

Kept apart from the pipeline so the policies can be read (and changed) in one place.

Failover policy: a channel has providers in order. A delivery goes to the first provider whose breaker lets it
through. After a retriable error that certainly did not send (connection refused, 5xx, 429), the next attempt
may go to the next provider, recorded as an event. After an ambiguous error (a timeout once the request had
left), the delivery stays with the same provider (which may deduplicate on our idempotency key) and the
decision is recorded: it is never silently re-sent elsewhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings

from channels_app import breaker
from channels_app.providers import registry
from channels_app.providers.base import (
    TICK,
    OutboundMessage,
    Outcome,
    Provider,
    ProviderError,
    RetriableError,
    UnexpectedError,
)
from core import metrics, provider_accounts, ratelimit
from core.categories import is_optional
from notifier.deliveries.selectors import delivery_mode
from preferences.services import preference_link, unsubscribe_url
from projects.scoping import owner_id
from projects.selectors import sending_settings

if TYPE_CHECKING:
    from channels_app.outcomes import Outcomes
    from notifier.deliveries.models import Delivery

logger = logging.getLogger(__name__)

BREAKER_WAIT_SECONDS = 30.0
# The unusable accounts already logged by this process: one line per account and channel, not one per delivery.
_reported: set[str] = set()


SANDBOX = "sandbox"


def pick_provider(channel: str, delivery: Delivery, out: Outcomes, want: int = 1) -> str | None:
    """Return the provider for this attempt, or None after deferring the delivery (no provider available).

    A test client's deliveries go to the sandbox provider whatever the channel's chain says: a staging service
    calling a production installation reaches no person (docs/api.md, "Test keys").
    """
    # Only the sandbox for a test key, even for a delivery pinned elsewhere: it never reaches a real provider.
    if delivery_mode(delivery) == "test":
        names = [SANDBOX]
    else:
        names, problem = _live_chain(channel, delivery, out)
        if not names:
            # Every account the project names for this channel is gone or another channel's: a fault an operator
            # fixes, so retried with backoff (bounded by DELIVERY_MAX_ATTEMPTS, then dead-lettered for a replay).
            out.retry(delivery, RetriableError(problem, code="provider_account"), "")
            return None
    retry_in = BREAKER_WAIT_SECONDS
    for name in names:
        admitted, wait = _breaker_admits(name, out, want)
        if admitted:
            if delivery.provider and name != delivery.provider and delivery.last_error:
                out.event(delivery.pk, "failover", f"{delivery.provider} -> {name}")
            return name
        retry_in = min(retry_in, wait or BREAKER_WAIT_SECONDS)
    out.wait(delivery, until=out.now + timedelta(seconds=max(retry_in, 1.0)), reason="breaker_open")
    return None


def _live_chain(channel: str, delivery: Delivery, out: Outcomes) -> tuple[list[str], str]:
    """Return the providers this attempt may try, in order (the channel's chain, pinned or rotated by history),
    and why there are none when a project's accounts are all unusable."""
    # The project's accounts for the channel if it names any (read from the per-process cache: no query).
    accounts = sending_settings(owner_id(delivery)).provider_accounts
    names = registry.chain(channel, accounts)
    problem = ""
    if accounts.get(channel):
        names, problem = _usable_accounts(names, channel, out)
    if delivery.pinned_provider:
        # An earlier attempt may have reached this provider: only it may have the next one, however long the
        # delivery has to wait for it (open breaker, rate limit). A provider removed from the chain since
        # gives way to the first one, recorded as a failover event below.
        pinned = delivery.pinned_provider
        return ([pinned] if pinned in names else names[:1]), problem
    if delivery.provider in names and delivery.last_error and len(names) > 1:
        # The last attempt failed retriably on this provider: start with the next one.
        start = (names.index(delivery.provider) + 1) % len(names)
        return names[start:] + names[:start], problem
    return names, problem


def _usable_accounts(names: list[str], channel: str, out: Outcomes) -> tuple[list[str], str]:
    """Return the accounts of `names` that exist and serve `channel`, and the problems of the others (logged once).

    An account of another kind would build another network's adapter: the message would go out through it.
    """
    usable, problems = [], []
    for name in names:
        key = f"{channel}:{name}"
        problem = out.account_problems.get(key)
        if problem is None:
            problem = out.account_problems[key] = provider_accounts.account_problem(name, channel) or ""
            if problem and key not in _reported:
                _reported.add(key)
                logger.error("%s: its %s deliveries are not sent through it", problem, channel)
        if problem:
            problems.append(problem)
        else:
            usable.append(name)
    return usable, "; ".join(problems)


def _breaker_admits(name: str, out: Outcomes, want: int = 1) -> tuple[bool, float]:
    """Ask the shared breaker once per provider and batch, then hand out its admitted slots.

    Ask for no more slots than the batch can use: a half-open breaker hands out a few probe slots, and a slot
    taken but never reported would keep it half-open for another cool-down.
    """
    slots = out.breaker_slots
    if name not in slots:
        admission = breaker.admit(name, max(1, want))
        slots[name] = [admission.allowed, admission.retry_in]
    allowed, retry_in = slots[name]
    if allowed <= 0:
        return False, retry_in
    slots[name][0] = allowed - 1
    return True, 0.0


def take_tokens(name: str, group: list[tuple[Delivery, OutboundMessage]], out: Outcomes) -> tuple[int, float]:
    """Take shared rate-limit tokens; return (how many of `group` may be sent now, seconds to wait).

    High-priority deliveries are put first and ask first: the limiter keeps a reserve only they may use.
    """
    group.sort(key=lambda item: item[0].priority != "high")
    n_high = sum(1 for delivery, _ in group if delivery.priority == "high")
    granted, wait = 0, 0.0
    if n_high:
        grant = ratelimit.acquire(name, n_high, priority="high")
        metrics.count_rate_limit(name, "high", n_high, grant.granted)
        granted, wait = grant.granted, grant.wait
        if grant.granted < n_high:
            return granted, wait
    if len(group) > n_high:
        grant = ratelimit.acquire(name, len(group) - n_high, priority="low")
        metrics.count_rate_limit(name, "low", len(group) - n_high, grant.granted)
        granted += grant.granted
        wait = max(wait, grant.wait)
    return granted, wait


def spread_waits(name: str, wait: float, n: int) -> list[float]:
    """Return when each of `n` rate-limited deliveries should come back: spaced at the provider's rate.

    Sending them all back after the same wait would have the whole backlog re-claimed and re-deferred every
    second; spaced out, each returns about when a token will be there for it.
    """
    limit, _ = ratelimit.limit_for(name)
    rate = limit.rate or 0.0
    if rate <= 0:
        return [wait] * n
    return [wait + i / rate for i in range(n)]


def timed_stream(
    provider: Provider, messages: list[OutboundMessage], window: threading.Semaphore | None = None, *, name: str = ""
) -> Iterator[tuple[int, Outcome | None]]:
    """Send a batch, yielding (index, outcome) as answers arrive, and (TICK, None) while none do.

    Records the whole call's latency at the end, under `name` (a named account's) or the provider's.
    """
    started = time.monotonic()
    failures = total = 0
    for index, outcome in provider.send_stream(messages, window=window, ticks=True):
        if index == TICK:
            yield index, None
            continue
        total += 1
        failures += isinstance(outcome, ProviderError)
        yield index, outcome
    elapsed = time.monotonic() - started
    result = "ok" if not failures else ("error" if failures == total else "partial")
    metrics.observe_provider_call(name or provider.name, elapsed, result)


@dataclass(frozen=True)
class Tally:
    """What a batch's outcomes say about their provider: healthy answers, failures, throttles (and their hint)."""

    answered: int
    failing: int
    throttled: int
    retry_after: float | None


def outcomes_tally(outcomes: Sequence[Outcome]) -> Tally:
    """Sort a batch's outcomes for the breaker and the adaptive limiter; an unexpected exception counts nowhere.

    Accepted and permanent errors are answers (the provider is healthy, a message was not); retriable errors are
    failures, or throttles when the provider asked us to slow down, with the longest Retry-After among them.
    """
    # An unexpected exception is our fault (a bug, a bad per-client setting), not the provider's answer.
    outcomes = [o for o in outcomes if not isinstance(o, UnexpectedError)]
    answered = sum(1 for o in outcomes if not isinstance(o, ProviderError) or not o.retriable)
    transient = [o for o in outcomes if isinstance(o, ProviderError) and o.retriable]
    throttled = [o for o in transient if o.throttled]
    retry_after = (max((o.retry_after or 0.0) for o in throttled) or None) if throttled else None
    return Tally(answered, len(transient) - len(throttled), len(throttled), retry_after)


def note_outcomes(name: str, outcomes: Sequence[Outcome]) -> None:
    """Feed a batch's outcomes to the breaker and the adaptive limiter (one call each, not one per message)."""
    tally = outcomes_tally(outcomes)
    if tally.answered:
        # A permanent error means the provider answered: it is healthy, the message was not.
        breaker.record(name, ok=True, n=tally.answered)
        ratelimit.on_success(name, tally.answered)
    if tally.failing:
        breaker.record(name, ok=False, n=tally.failing)
    if tally.throttled:
        ratelimit.on_throttled(name, tally.retry_after)
        metrics.count_throttled(name, tally.throttled)


def message_meta(delivery: Delivery) -> dict[str, Any]:
    """Return per-message extras for the adapter: for optional email the one-click unsubscribe link and,
    beside it, the link to the recipient's preference center (added to the body by the pipeline)."""
    if delivery.channel == "email" and is_optional(delivery.notification.category):
        url = unsubscribe_url(recipient=delivery.recipient, category=delivery.notification.category)
        return {"list_unsubscribe": url, "preferences_url": recipient_preferences_url(delivery)}
    return {}


def sender_meta(delivery: Delivery) -> dict[str, Any]:
    """Return the project's sender identities for the delivery's channel, where the project sets them.

    The adapters use them instead of the account's or installation's (EMAIL_FROM, EMAIL_REPLY_TO, the SMS
    sender): `from_email` and `reply_to` for email, `sms_from` for SMS. Read from the per-process cache.
    """
    project = sending_settings(owner_id(delivery))
    meta: dict[str, Any] = {}
    if delivery.channel == "email":
        if project.email_from:
            meta["from_email"] = project.email_from
        if project.email_reply_to:
            meta["reply_to"] = project.email_reply_to
    elif delivery.channel == "sms" and project.sms_sender:
        meta["sms_from"] = project.sms_sender
    return meta


def recipient_preferences_url(delivery: Delivery) -> str:
    """Return a fresh preference-center link for the delivery's recipient, valid for the configured lifetime."""
    url, _ = preference_link(recipient=delivery.recipient, ttl_seconds=settings.PREFERENCE_LINK_TTL_SECONDS)
    return url
