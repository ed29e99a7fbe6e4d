"""The API client of a key hash, cached per process (core.config_cache) because every request reads it."""

from __future__ import annotations

import copy
from typing import Any

from core import config_cache


# Model imports stay inside the functions below: notifier.clients.auth imports this module, and DRF loads it as a
# setting before the app registry is ready, when a models import would raise AppRegistryNotReady.
def api_client(key_hash: str) -> Any:
    """Return a copy of the active API client with this key hash, or None."""
    from notifier.clients.models import ApiClient

    found = config_cache.cached(
        "client", key_hash, lambda: ApiClient.objects.filter(key_hash=key_hash, is_active=True).first()
    )
    # A copy per request: views and services may set attributes on their client, never on the shared one.
    return copy.copy(found) if found is not None else None


def api_client_cached(key_hash: str) -> Any:
    """Return this process's cached client of this key hash, unchecked against the generation (None if none).

    Only to prepare work that `api_client` then confirms: a revoked key's copy may still be here.
    """
    return config_cache.peek("client", key_hash)


def touched(key_hash: str, at: Any) -> None:
    """Record in the cached client that its `last_used_at` was written (so it is written once a minute)."""
    hit = config_cache.peek("client", key_hash)
    if hit is not None:
        hit.last_used_at = at
