"""The per-client API rate limit: one token bucket per API client in Redis, shared by every API process.

It reuses the provider limiter's machinery (core.ratelimit: the same Lua token bucket on Redis' clock,
and the same per-process fallback with the rate divided by RESILIENCE_ASSUMED_WORKERS while Redis is down).
A client's limit is its own `rate_limit` ("200/s", "1000/m", "50000/h"), else API_CLIENT_RATE_LIMIT; the
bucket holds the numerator's worth of tokens, so "200/s" allows bursts of 200 and refills 200 a second.
Beyond it DRF raises Throttled, which the error handler answers as 429 `rate_limited` with Retry-After.

`RateThrottle` and `rate_take` are the same for any other caller with a bucket of its own (the browser
inbox's tokens, notifier/inbox/rate_limit.py).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from core.ratelimit import Grant, Limit, RateLimiter
from core.redis_guard import rkey
from notifier.clients.auth import request_client

if TYPE_CHECKING:  # types only: DRF loads this module from settings, before the models may be
    from notifier.clients.models import ApiClient

RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$", re.IGNORECASE)
PERIOD_SECONDS = {"s": 1, "m": 60, "h": 3600}

_limiter = RateLimiter()


def parse_rate(text: str) -> tuple[float, float]:
    """Parse "200/s", "1000/m" or "50000/h" into (tokens per second, burst); raise ValueError otherwise."""
    match = RATE.match(text or "")
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"'{text}' is not a rate such as 200/s, 1000/m or 50000/h")
    count = float(match.group(1))
    return count / PERIOD_SECONDS[match.group(2)[0].lower()], max(count, 1.0)


def rate_limit(text: str) -> Limit:
    """Return the token bucket limit of a rate such as "200/s": that many tokens, refilled over the period."""
    rate, burst = parse_rate(text)
    return Limit(rate=rate, burst=burst, high_reserve=0.0, min_rate=rate, increase=0.0)


def client_limit(client: ApiClient) -> Limit:
    """Return the token bucket limit of an API client (its own rate, else the default)."""
    return rate_limit(getattr(client, "rate_limit", "") or settings.API_CLIENT_RATE_LIMIT)


def rate_take(key: str, limit: Limit) -> Grant:
    """Take one request's token from the shared bucket `key`; the grant says whether, and how long to wait if not."""
    return _limiter.acquire_buckets([(key, limit)], 1, high=True)


class RateThrottle(BaseThrottle):
    """Allow a request while its caller's shared bucket has a token; remember the wait otherwise.

    A subclass says which bucket a request takes from (`bucket`: its key and limit, None for a request this
    throttle does not limit).
    """

    def __init__(self) -> None:
        self._wait = 0.0

    def bucket(self, request: Request) -> tuple[str, Limit] | None:
        """Return the key and limit of the bucket `request` takes a token from, or None to let it through."""
        raise NotImplementedError

    def allow_request(self, request: Request, view: Any) -> bool:
        bucket = self.bucket(request)
        if bucket is None:
            return True
        grant = rate_take(*bucket)
        self._wait = grant.wait
        return grant.granted >= 1

    def wait(self) -> float:
        return max(self._wait, 0.001)


class ApiClientRateThrottle(RateThrottle):
    """Allow a request while its API client's shared bucket has a token."""

    def bucket(self, request: Request) -> tuple[str, Limit] | None:
        client = request_client(request)  # typed as the ApiClient; an anonymous user has no pk (next line)
        if client is None or not getattr(client, "pk", None):
            return None  # unauthenticated requests are answered 401 before this
        return rkey("api-rl", str(client.pk)), client_limit(client)
