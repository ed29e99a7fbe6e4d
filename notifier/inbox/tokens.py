"""Short-lived inbox tokens: one user's inbox, readable from a browser without the service's API key.

A token is signed (Django's signer with SECRET_KEY and a salt of its own) and carries the recipient, its
user id, its project environment and an expiry; no database row. The calling service mints one for the user it
has logged in and hands it to its front end; the token opens /inbox/v1/ for that user only, until it expires.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.core import signing

from preferences.models import Recipient

SALT = "notifier.inbox.token.v1"


@dataclass(frozen=True)
class InboxPrincipal:
    """Who an inbox token speaks for: one recipient (DRF's request.user for /inbox/v1/)."""

    recipient_id: int
    user_id: str
    expires: int
    # The recipient's project environment: the same user id names another recipient in every other one.
    # None in a token minted before tokens named it (its recipient row says).
    environment_id: int | None = None

    is_authenticated = True


def inbox_token_mint(*, recipient: Recipient, ttl_seconds: int) -> tuple[str, datetime]:
    """Return a signed token for the recipient's inbox and when it expires."""
    expires = int(time.time()) + ttl_seconds
    claims = {"r": recipient.pk, "u": recipient.user_id, "o": recipient.environment_id, "e": expires}
    token = signing.dumps(claims, salt=SALT, compress=True)
    return token, datetime.fromtimestamp(expires, tz=UTC)


def inbox_token_verify(token: str) -> InboxPrincipal | None:
    """Return the principal of a valid, unexpired token; None for anything else (tampered, expired, garbage)."""
    try:
        claims = signing.loads(token, salt=SALT)
        owner = claims.get("o")
        principal = InboxPrincipal(
            int(claims["r"]), str(claims["u"]), int(claims["e"]), None if owner is None else int(owner)
        )
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        return None
    if principal.expires <= time.time():
        return None
    return principal
