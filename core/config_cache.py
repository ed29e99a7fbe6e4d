"""Per-process caches of configuration every request reads and seldom changes, invalidated everywhere at once.

An accept read its client (authentication) and its template's published version from the database each time:
two queries, about a quarter of its CPU. Such lookups are kept here, per process, and invalidated by a
generation number in Redis: every save or delete of a cached model (`invalidate_on_change`; any process, admin
or API) bumps it after commit, and a lookup first reads it (one Redis GET, far cheaper than a query; the
lookups of one request share one read, `one_generation`) and drops the process's entries when it moved. A
key revoked or rotated, or a template published, is therefore seen by the next request of every process, not
after a TTL: a post_save signal with a TTL alone would leave a revoked key working in the other processes for
the TTL. Writes that bypass model signals (`QuerySet.update`) must call `config_changed()` themselves if a
cached answer depends on them.

Redis unreachable: no caching at all (every lookup goes to the database, as before), never a stale answer.
Entries live at most MAX_SECONDS (60 s) anyway (a safety net for a bump lost with Redis' data).

The cached lookups live with the models they read: `notifier.clients.lookup_cache` (API clients by key),
`templates_app.selectors` (template versions), `notifier.statusevents.selectors` (whether a client has an
event endpoint).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from django.db import transaction
from redis.exceptions import RedisError

from core.redis_guard import get_redis, rkey

T = TypeVar("T")

MAX_SECONDS = 60.0
MAX_ENTRIES = 2048
_GENERATION = ("config", "generation")

_lock = threading.Lock()
_entries: dict[tuple[str, str], tuple[Any, float]] = {}
_seen_generation: list[str | None] = [None]
# Clears of other per-process caches emptied with this one, on a new generation and by forget_all: caches of
# immutable rows keyed by names that a row deleted and made again takes anew (a template deleted in the admin and
# saved again restarts at version 1; a test database truncated between tests does the same).
_companions: list[Callable[[], None]] = []


# Inside one_generation(): the generation read by the block's first lookup (empty until then).
_pinned: ContextVar[list[str | None] | None] = ContextVar("config_cache_generation", default=None)


@contextmanager
def one_generation() -> Iterator[None]:
    """Read the generation at most once inside the block: the lookups of one request share one Redis GET.

    A change made by another process during the request is seen by the next request, as before; one made in
    this process clears its entries at once anyway (config_changed).
    """
    token = _pinned.set([])
    try:
        yield
    finally:
        _pinned.reset(token)


def _generation() -> str | None:
    """Return the current generation, or None when Redis cannot say (then nothing is cached)."""
    pinned = _pinned.get()
    if pinned:
        return pinned[0]
    try:
        value: str | None = str(get_redis().get(rkey(*_GENERATION)) or "0")
    except RedisError:
        value = None
    if pinned is not None:
        pinned.append(value)
    return value


def current_generation() -> str | None:
    """Return the generation (None: Redis cannot say, cache nothing), first dropping entries of an older one.

    Other per-process caches (see `forget_all_also`) call this before reusing an entry across requests or
    batches: when it moved, their entries are already gone.
    """
    generation = _generation()
    _observe(generation)
    return generation


def generation_key() -> str:
    """Return the Redis key of the generation, for a caller that reads it in a round trip it makes anyway."""
    return rkey(*_GENERATION)


def adopt_generation(value: str | None) -> bool:
    """Take `value`, read from Redis by the caller (None: Redis did not answer), as the current generation.

    Inside one_generation() it becomes the block's read, so its lookups make none of their own. Returns whether
    it moved since this process last looked (its entries are then already dropped).
    """
    pinned = _pinned.get()
    if pinned is not None and not pinned:
        pinned.append(value)
    return _observe(value)


def _observe(generation: str | None) -> bool:
    """Drop this process's entries (and its companions') when `generation` is not the one they were loaded under."""
    if generation is None or _seen_generation[0] == generation:
        return False
    with _lock:
        if _seen_generation[0] == generation:
            return False
        _entries.clear()
        _seen_generation[0] = generation
        for clear in _companions:
            clear()
    return True


def cached(kind: str, key: str, load: Callable[[], T | None]) -> T | None:
    """Return the cached value of (kind, key), loading it with `load()` when absent, stale or invalidated.

    A None from `load` (not found) is not cached: a request with an unknown key must not fill the cache.
    """
    generation = current_generation()
    if generation is None:
        return load()
    now = time.monotonic()
    # The lookup itself takes no lock (a request makes several): a dict read is atomic, and an entry read just
    # before another thread clears the dict is one this lookup could as well have read before the clear.
    hit = _entries.get((kind, key))
    if hit is not None and now - hit[1] < MAX_SECONDS:
        found: T = hit[0]
        return found
    value = load()
    if value is not None:
        with _lock:
            if len(_entries) >= MAX_ENTRIES:
                _entries.clear()
            if _seen_generation[0] == generation:  # not invalidated while loading
                _entries[(kind, key)] = (value, now)
    return value


def peek(kind: str, key: str) -> Any | None:
    """Return this process's cached value of (kind, key) without loading or checking the generation, or None."""
    with _lock:
        hit = _entries.get((kind, key))
    return hit[0] if hit is not None else None


def forget(kind: str, key: str) -> None:
    """Drop one entry of this process."""
    with _lock:
        _entries.pop((kind, key), None)


def forget_all() -> None:
    """Drop every entry of this process (a test's rows go with it, so must what was cached of them)."""
    with _lock:
        _entries.clear()
        _seen_generation[0] = None
    for clear in _companions:
        clear()


def forget_all_also(clear: Callable[[], None]) -> None:
    """Have `clear` called whenever this process's entries are dropped whole (see _companions)."""
    _companions.append(clear)


def config_changed() -> None:
    """Invalidate every process's cache once the current transaction commits (at once outside one)."""
    with _lock:
        _entries.clear()

    def bump() -> None:
        with _lock:
            _entries.clear()
        try:
            get_redis().incr(rkey(*_GENERATION))
        except RedisError:
            # Lookups read the generation first; a Redis that cannot take the bump cannot answer them either,
            # so no process caches until it is back (and entries expire after MAX_SECONDS regardless).
            pass

    transaction.on_commit(bump)


def _on_change(sender: Any, **_kwargs: Any) -> None:
    config_changed()


def invalidate_on_change(*models: Any) -> None:
    """Invalidate every process's cache on each save and delete of these models (call from an AppConfig.ready)."""
    from django.db.models.signals import post_delete, post_save

    for model in models:
        label = model._meta.label_lower
        post_save.connect(_on_change, sender=model, weak=False, dispatch_uid=f"config_cache.save.{label}")
        post_delete.connect(_on_change, sender=model, weak=False, dispatch_uid=f"config_cache.delete.{label}")
