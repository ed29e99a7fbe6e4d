"""Start-up checks of the inbox's settings: the inbox tokens' rate."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from notifier.clients.rate_limit import parse_rate


@checks.register()
def inbox_token_rate_limit_valid(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Refuse an INBOX_TOKEN_RATE_LIMIT that is not a rate such as "20/s" (every /inbox/v1/ request would fail)."""
    try:
        parse_rate(settings.INBOX_TOKEN_RATE_LIMIT)
    except ValueError as exc:
        return [checks.Error(f"INBOX_TOKEN_RATE_LIMIT: {exc}", id="notifier.E040")]
    return []
