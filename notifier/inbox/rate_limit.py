"""The browser inbox's rate limit: one token bucket per recipient an inbox token speaks for, shared in Redis.

An inbox token lives in a browser, so whoever holds it could call /inbox/v1/ without end. Every request of
a token (the JSON endpoints, and each attempt to open the stream) takes a token from its recipient's bucket
of INBOX_TOKEN_RATE_LIMIT ("20/s": bursts of 20, 20 more a second). The bucket is the recipient's, not the
token string's: all of one user's tokens share it, so minting more tokens buys no more requests. Beyond it:
429 `rate_limited` with Retry-After, as the API's per-client limit answers (notifier/clients/rate_limit.py,
whose machinery this is; per process while Redis is down).
"""

from __future__ import annotations

from django.conf import settings
from rest_framework.request import Request

from core.ratelimit import Grant, Limit
from core.redis_guard import rkey
from notifier.clients.rate_limit import RateThrottle, rate_limit, rate_take
from notifier.inbox.tokens import InboxPrincipal


def inbox_bucket(recipient_id: int) -> tuple[str, Limit]:
    """Return the key and limit of the bucket of the recipient an inbox token speaks for."""
    return rkey("inbox-rl", str(recipient_id)), rate_limit(settings.INBOX_TOKEN_RATE_LIMIT)


def inbox_rate_take(*, recipient_id: int) -> Grant:
    """Take one request's token from the recipient's bucket (the stream's connection attempts)."""
    return rate_take(*inbox_bucket(recipient_id))


class InboxTokenRateThrottle(RateThrottle):
    """Allow an /inbox/v1/ request while its token's recipient's bucket has a token."""

    def bucket(self, request: Request) -> tuple[str, Limit] | None:
        principal = request.user
        if not isinstance(principal, InboxPrincipal):
            return None  # no valid token: answered 401 before this
        return inbox_bucket(principal.recipient_id)
