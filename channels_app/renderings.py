"""The renderings a send worker process keeps between batches: one rendering for every delivery that shares it.

A rendering depends on the template version (immutable), the channel, the locale and the payload, and for an
email on its layout (the newest version of the layout the template, its category or its project names). So it
is kept under those, not under the notification: a topic's deliveries share one notification, but a topic
workflow sends one notification per run, each with the trigger's payload, and a million runs of a slow template
would otherwise be a million renders holding the send workers from every other project's deliveries. Keyed by
content, they are one render per worker process and locale, as a topic broadcast is.

Reusing a rendering across notifications is safe only while what it depends on has not changed: layouts,
templates and projects bump the configuration generation (core/config_cache.py) when saved, which empties this
cache in every process at its next batch, and an entry lives at most `config_cache.MAX_SECONDS` anyway. Redis
unreachable (no generation to check): renderings are kept per notification only, as they were before.

A rendering that failed is kept as its error too (every delivery with the same content fails at once instead of
holding a worker for its own render up to the time budget); one that found every render child busy is not.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import orjson
from django.core.signals import setting_changed
from django.dispatch import receiver

from core import config_cache

MAX_ENTRIES = 10_000

_entries: dict[tuple[Any, ...], tuple[Any, float]] = {}
config_cache.forget_all_also(_entries.clear)


@receiver(setting_changed)
def _forget_on_setting(**_kwargs: Any) -> None:
    # A category's default layout and the template budgets are settings (changed at run time only by tests).
    _entries.clear()


def shared() -> bool:
    """Return whether renderings may be shared across notifications now (the generation is known and current)."""
    return config_cache.current_generation() is not None


def key(
    *, notification_id: Any, version_id: int, channel: str, locale: str, payload: dict[str, Any], shared: bool
) -> tuple[Any, ...]:
    """Return the key a rendering is kept under: its content when `shared`, else its notification."""
    if not shared:
        return ("notification", notification_id, channel, locale)
    try:
        encoded = orjson.dumps(payload or {}, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # what orjson cannot encode (an integer beyond 64 bits) the standard module can
        encoded = json.dumps(payload, sort_keys=True).encode()
    return ("content", version_id, channel, locale, hashlib.blake2b(encoded, digest_size=16).digest())


def get(found_key: tuple[Any, ...]) -> Any | None:
    """Return the rendering (or its error) kept under `found_key`, or None when there is none or it is too old."""
    hit = _entries.get(found_key)
    if hit is None or time.monotonic() - hit[1] >= config_cache.MAX_SECONDS:
        return None
    return hit[0]


def put(found_key: tuple[Any, ...], value: Any) -> None:
    """Keep a rendering (or its error) under `found_key`."""
    if len(_entries) >= MAX_ENTRIES:
        _entries.clear()
    _entries[found_key] = (value, time.monotonic())


def forget() -> None:
    """Drop every rendering of this process."""
    _entries.clear()
