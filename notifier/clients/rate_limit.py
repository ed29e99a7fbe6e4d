"""The per-client API rate limit: one token bucket per API client in Redis, shared by every API process.

It reuses the provider limiter's machinery (core.ratelimit: the same Lua token bucket on Redis' clock,
and the same per-process fallback with the rate divided by RESILIENCE_ASSUMED_WORKERS while Redis is down).
A client's limit is its own `rate_limit` ("200/s", "1000/m", "50000/h"), else API_CLIENT_RATE_LIMIT; the
bucket holds the numerator's worth of tokens, so "200/s" allows bursts of 200 and refills 200 a second.
A project with a `rate_limit` of its own has one more bucket, shared by all of its keys (both environments'):
a request takes a token from its client's and its project's buckets at once, in the same script call (one
Redis round trip, as with the client's alone), and only when both have one. Beyond either, DRF raises
Throttled, which the error handler answers as 429 `rate_limited` with Retry-After.

`RateThrottle` and `rate_take` are the same for any other caller with a bucket of its own (the browser
inbox's tokens, notifier/inbox/rate_limit.py).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from core import config_cache
from core.ratelimit import Grant, Limit, RateLimiter, parse_rate
from core.redis_guard import rkey
from projects.scoping import owner_id
from projects.selectors import environment_settings

if TYPE_CHECKING:  # types only: DRF loads this module from settings, before the models may be
    from notifier.clients.models import ApiClient

logger = logging.getLogger(__name__)

_limiter = RateLimiter()


@functools.lru_cache(maxsize=256)
def rate_limit(text: str) -> Limit:
    """Return the token bucket limit of a rate such as "200/s": that many tokens, refilled over the period.

    Cached: every request asks for its client's (and project's) limit, and a few rate texts serve them all; a
    Limit is immutable, and a text that is not a rate raises again each time (exceptions are not cached).
    """
    rate, burst = parse_rate(text)
    return Limit(rate=rate, burst=burst, high_reserve=0.0, min_rate=rate, increase=0.0)


def client_limit(client: ApiClient) -> Limit:
    """Return the token bucket limit of an API client (its own rate, else the default)."""
    return rate_limit(getattr(client, "rate_limit", "") or settings.API_CLIENT_RATE_LIMIT)


def _project_bucket_of(found: Any) -> tuple[str, Limit] | None:
    """Return the key and limit of the bucket of the project whose settings `found` are, None if it has no limit.

    The settings come from the per-process cache of the environment's (projects.selectors): no query per request.
    """
    if found is None or not found.rate_limit:
        return None
    try:
        limit = rate_limit(found.rate_limit)
    except ValueError:
        # The admin refuses such a rate; one written otherwise must not fail every request of the project.
        logger.error("project %s: rate_limit %r is not a rate; not enforced", found.slug, found.rate_limit)
        return None
    return rkey("api-rl-project", str(found.project_id)), limit


def rate_take(key: str, limit: Limit) -> Grant:
    """Take one request's token from the shared bucket `key`; the grant says whether, and how long to wait if not."""
    return rate_take_all([(key, limit)])


def rate_take_all(buckets: list[tuple[str, Limit]]) -> Grant:
    """Take one token from each bucket at once (one script call), or none unless every bucket has one."""
    return _limiter.acquire_buckets(buckets, 1, high=True)


# Where `take_before_authentication` leaves its grant on the request, with the buckets it took from.
_TAKEN = "_notifier_rate_taken"


def take_before_authentication(request: Request, client: ApiClient) -> None:
    """Take `request`'s token for this process's cached copy of its client, reading the generation in the same call.

    Authentication must check its cached client against the configuration generation (a Redis read), and the
    throttle takes a token (a Redis script): one round trip does both. The client is this process's copy,
    not yet checked: authentication adopts the generation read here, reloads the client if it moved, and
    `ApiClientRateThrottle` uses this grant only if the client's buckets are still the ones taken from (else it
    takes again). Nothing is taken when the client's project settings are not cached here either (their read
    would need the generation first).
    """
    project = config_cache.peek("environment-settings", str(owner_id(client)))
    if project is None:
        return
    buckets = _client_buckets(client, project)
    grant = _limiter.acquire_buckets(buckets, 1, high=True, read_along=config_cache.generation_key())
    # Redis not answering (the limiter's local fallback): no generation, so nothing is served from the caches.
    config_cache.adopt_generation(None if grant.degraded else grant.value or "0")
    setattr(request, _TAKEN, (buckets, grant))


def _client_buckets(client: ApiClient, project: Any) -> list[tuple[str, Limit]]:
    """Return the client's bucket and, if its project (`project`: its environment settings) has a limit, that one."""
    own = (rkey("api-rl", str(client.pk)), client_limit(client))
    bucket = _project_bucket_of(project)
    return [own] if bucket is None else [own, bucket]


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

    def buckets(self, request: Request) -> list[tuple[str, Limit]]:
        """Return every bucket `request` takes a token from (by default its `bucket`)."""
        bucket = self.bucket(request)
        return [] if bucket is None else [bucket]

    def allow_request(self, request: Request, view: Any) -> bool:
        buckets = self.buckets(request)
        if not buckets:
            return True
        taken = getattr(request, _TAKEN, None)
        # Taken with authentication (one round trip) from the same buckets, or taken now.
        grant = taken[1] if taken is not None and taken[0] == buckets else rate_take_all(buckets)
        self._wait = grant.wait
        return grant.granted >= 1

    def wait(self) -> float:
        return max(self._wait, 0.001)


class ApiClientRateThrottle(RateThrottle):
    """Allow a request while its API client's shared bucket, and its project's if it has one, have a token."""

    def buckets(self, request: Request) -> list[tuple[str, Limit]]:
        # On /api/v1 the user is the ApiClient authentication returned (notifier.clients.auth, which imports this
        # module); an anonymous user has no pk (unauthenticated requests are answered 401 before this).
        client = cast("ApiClient", request.user)
        if client is None or not getattr(client, "pk", None):
            return []
        return _client_buckets(client, environment_settings(owner_id(client)))
