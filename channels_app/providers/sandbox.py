"""The sandbox provider: records what would have been sent, so the pipeline runs with no provider account.

It is also the test double the fault tests drive through SANDBOX_BEHAVIOUR (a real provider adapter in every
other respect: it goes through the same rate limiter, breaker, retries and outcome recording):

- ``fail:N``      the first N attempts of each delivery fail with a retriable error (503)
- ``fail``        every attempt fails with a retriable error (exhausts retries → dead letter)
- ``permanent``   every attempt fails permanently
- ``throttle:N``  the first N attempts are throttled (429, Retry-After 1)
- ``slow:MS``     every call takes MS milliseconds (made concurrently, like real I/O)

Prefix a behaviour with a channel to limit it (``email=fail:2``); separate several with ``;``.
Recording is idempotent per delivery (unique delivery_id), like a provider honouring an idempotency key: a
re-sent delivery is recorded once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.utils import timezone

from channels_app.providers.base import (
    OutboundMessage,
    Outcome,
    PermanentError,
    Provider,
    RetriableError,
    SendResult,
)
from core.chat import CHAT_CHANNELS
from core.db import bound_cursor, json_rows


def parse_behaviour(spec: str) -> dict[str, tuple[str, int]]:
    """Parse SANDBOX_BEHAVIOUR into {channel or "*": (mode, number)}."""
    rules: dict[str, tuple[str, int]] = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        channel, _, rule = part.rpartition("=")
        mode, _, number = rule.partition(":")
        rules[channel or "*"] = (mode.strip(), int(number) if number.strip() else 0)
    return rules


class SandboxProvider(Provider):
    """Record messages in the database instead of sending them."""

    name = "sandbox"
    channels = ("push", "email", "sms", "inapp", "webhook", *CHAT_CHANNELS)

    def __init__(self, behaviour: str = "") -> None:
        self.rules = parse_behaviour(behaviour)

    @classmethod
    def from_settings(cls) -> SandboxProvider:
        return cls(settings.SANDBOX_BEHAVIOUR)

    def _rule(self, channel: str) -> tuple[str, int]:
        return self.rules.get(channel) or self.rules.get("*") or ("", 0)

    def _check(self, message: OutboundMessage) -> Outcome | None:
        """Return the simulated failure for this attempt, or None to record the message."""
        mode, number = self._rule(message.channel)
        attempt = int(message.meta.get("attempt", 1))
        if mode == "slow":
            time.sleep(number / 1000)
        elif mode == "fail" and (number == 0 or attempt <= number):
            return RetriableError("sandbox: simulated outage", code="503")
        elif mode == "permanent":
            return PermanentError("sandbox: simulated rejection", code="400")
        elif mode == "throttle" and (number == 0 or attempt <= number):
            return RetriableError("sandbox: simulated throttling", code="429", retry_after=1.0, throttled=True)
        return None

    def _record(self, messages: Sequence[OutboundMessage]) -> None:
        """Insert one row per delivery in one statement; a repeated delivery only bumps its send_count."""
        with bound_cursor() as cursor:
            cursor.execute(
                "INSERT INTO channels_app_sandboxmessage"
                " (delivery_id, client_id, channel, provider, address, content, send_count, created_at)"
                " SELECT (e->>0)::bigint, (e->>4)::bigint, e->>1, %s, e->>2, (e->3)::jsonb, 1, %s"
                " FROM jsonb_array_elements(%s::jsonb) AS e"
                " ON CONFLICT (delivery_id) DO UPDATE SET send_count = channels_app_sandboxmessage.send_count + 1",
                [
                    self.name,
                    timezone.now(),
                    json_rows(
                        (m.delivery_id, m.channel, m.address, m.content, m.meta.get("client_id")) for m in messages
                    ),
                ],
            )

    def send(self, message: OutboundMessage) -> SendResult:
        outcome = self.send_batch([message])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def send_batch(self, messages: Sequence[OutboundMessage]) -> list[Outcome]:
        if any(self._rule(m.channel)[0] == "slow" for m in messages) and len(messages) > 1:
            with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(messages))) as pool:
                checks = list(pool.map(self._check, messages))
        else:
            checks = [self._check(m) for m in messages]
        to_record = [m for m, failure in zip(messages, checks, strict=True) if failure is None]
        if to_record:
            self._record(to_record)
        return [failure or SendResult(f"sandbox-{m.delivery_id}") for m, failure in zip(messages, checks, strict=True)]
