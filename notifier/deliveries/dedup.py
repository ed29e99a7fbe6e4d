"""Idempotency keys: Redis SET NX as the fast path, the notifier_dedupkey table as the truth.

The table's primary key (client_id, dedup_key) is what makes a key unique: the notifications themselves are
partitioned by day, and a partition's unique index sees only its own day. A key row lives for the dedup
window (DEDUP_WINDOW_HOURS, docs/api.md); after it, the same key is free for a new notification (the expired
row is taken over in place) and `purge_expired` deletes the rest in batches.

Redis only ever saves work; it never decides alone. A key found in Redis still has to be matched to a committed
notification (or to the request that is committing it right now, which the unique index makes us wait for).
If Redis is down, every request simply takes the database path.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, cast

import redis
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core.db import bound_cursor, json_rows, texts_param
from core.redis_guard import get_redis, redis_script, rkey

logger = logging.getLogger(__name__)


def _key(client_id: int, dedup_key: str) -> str:
    return rkey("dedup", client_id, dedup_key)


def claim(*, client_id: int, dedup_key: str, notification_id: str, request_hash: str) -> tuple[bool, str | None]:
    """Try to reserve `dedup_key` for a new notification.

    Returns (won, existing): `won` is True when this request may create the notification (or Redis is
    unavailable); otherwise `existing` is "<notification id>|<request hash>" of the first request.
    """
    try:
        r = get_redis()
        value = f"{notification_id}|{request_hash}"
        if r.set(_key(client_id, dedup_key), value, nx=True, ex=settings.DEDUP_TTL_SECONDS):
            return True, None
        # get_redis() decodes responses: a str (redis-py types it bytes | str for any client).
        return False, cast("str | None", r.get(_key(client_id, dedup_key)))
    except redis.RedisError as exc:
        logger.warning("dedup fast path degraded, using the database only: %s", type(exc).__name__)
        return True, None


def release(*, client_id: int, dedup_key: str, notification_id: str) -> None:
    """Drop a reservation whose notification was never committed, so a retry of the request can succeed."""
    try:
        r = get_redis()
        key = _key(client_id, dedup_key)
        value = cast("str | None", r.get(key))  # a decoding client: str
        if value and value.split("|", 1)[0] == notification_id:
            r.delete(key)
    except redis.RedisError:
        # The database is the truth; a stale reservation only costs the next request a database lookup.
        pass


# One script call for all of a call's keys: SET NX each, answer the positions of those already held.
_CLAIM = """
local held = {}
for i, key in ipairs(KEYS) do
  if not redis.call('SET', key, ARGV[i + 1], 'NX', 'EX', ARGV[1]) then held[#held + 1] = i end
end
return held
"""

# Drop the keys whose value is still one of ours ("<notification id>|..."), one script call.
_RELEASE = """
for i, key in ipairs(KEYS) do
  local value = redis.call('GET', key)
  if value and string.sub(value, 1, string.len(ARGV[i])) == ARGV[i] then redis.call('DEL', key) end
end
return #KEYS
"""


def claim_many(*, client_id: int, entries: list[tuple[str, str, str]]) -> set[str]:
    """Mark (dedup_key, notification_id, request_hash) entries as taken in Redis; return the keys already held.

    One round trip for any number of keys. A held key may be a duplicate, for the database to say; a key Redis
    did not hold is new unless Redis lost it, and the table's primary key still holds such a key (`reserve`).
    Where Redis cannot answer, every key is returned: the database decides them all.
    """
    if not entries:
        return set()
    try:
        held = redis_script(_CLAIM)(
            keys=[_key(client_id, key) for key, _, _ in entries],
            args=[settings.DEDUP_TTL_SECONDS, *(f"{nid}|{request_hash}" for _, nid, request_hash in entries)],
        )
    except redis.RedisError as exc:
        logger.warning("dedup fast path degraded, using the database only: %s", type(exc).__name__)
        return {key for key, _, _ in entries}
    return {entries[int(position) - 1][0] for position in held}


def release_many(*, client_id: int, entries: list[tuple[str, str]]) -> None:
    """Drop the (dedup_key, notification_id) claims whose notification was not written, so a retry can succeed."""
    if not entries:
        return
    try:
        redis_script(_RELEASE)(
            keys=[_key(client_id, key) for key, _ in entries], args=[f"{nid}|" for _, nid in entries]
        )
    except redis.RedisError:
        # The database is the truth; a stale claim only costs the next request a database look up.
        pass


# ---- the database's record of dedup keys (notifier_dedupkey), the truth across partitions ----------------

PURGE_BATCH = 10_000


def _cutoff() -> Any:
    return timezone.now() - timedelta(hours=settings.DEDUP_WINDOW_HOURS)


_RESERVE_SQL = """
    INSERT INTO notifier_dedupkey (client_id, dedup_key, notification_id, request_hash, created_at)
    SELECT %s, e->>0, (e->>1)::uuid, e->>2, %s FROM jsonb_array_elements(%s::jsonb) AS e
    ON CONFLICT (client_id, dedup_key) DO UPDATE
        SET notification_id = EXCLUDED.notification_id, request_hash = EXCLUDED.request_hash,
            created_at = EXCLUDED.created_at
        WHERE notifier_dedupkey.created_at < %s
    RETURNING dedup_key
"""


def reserve(*, client_id: int, entries: list[tuple[str, str, str]]) -> set[str]:
    """Record (dedup_key, notification_id, request_hash) entries in the accept's transaction; return the keys won.

    A key held by a live entry (another request's, committed or committing: the insert waits for it) is not
    won; an entry older than the window is taken over. Must run inside the transaction that writes the
    notifications, so a rollback frees the keys.
    """
    if not entries:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(_RESERVE_SQL, [client_id, timezone.now(), json_rows(entries), _cutoff()])
        return {row[0] for row in cursor.fetchall()}


def unreserve(*, client_id: int, entries: list[tuple[str, str, str]]) -> None:
    """Give back keys this transaction reserved with `entries` and will not use (their notification ids are ours).

    What a rollback to a savepoint would undo, without one: a key taken over from an expired entry is deleted
    rather than restored, which is the same to every later request (an expired key is no key).
    """
    if entries:
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM notifier_dedupkey WHERE client_id = %s AND (dedup_key, notification_id) IN"
                " (SELECT e->>0, (e->>1)::uuid FROM jsonb_array_elements(%s::jsonb) AS e)",
                [client_id, json_rows(entries)],
            )


# One primary-key probe per key, whatever the statistics: the sub-select with its LIMIT cannot be flattened into
# a join, so it runs once per key with both key columns bound. As `dedup_key = ANY(…)`, a planner that took the
# client's keys for a handful (statistics from before a burst) read them all and tested each against the thousand
# wanted: 270 ms a batch of 1,000 on average over one benchmark run, more with every batch written.
_LOOKUP_SQL = (
    "SELECT k.key, d.notification_id, d.request_hash FROM jsonb_array_elements_text(%s::jsonb) AS k(key)"
    " CROSS JOIN LATERAL (SELECT notification_id, request_hash FROM notifier_dedupkey"
    " WHERE client_id = %s AND dedup_key = k.key AND created_at >= %s LIMIT 1) AS d"
)


def lookup(*, client_id: int, dedup_keys: list[str]) -> dict[str, tuple[str, str]]:
    """Return {dedup_key: (notification_id, request_hash)} of the client's keys still within the window."""
    if not dedup_keys:
        return {}
    # Bound on the server: Django's cursor would quote a thousand keys into the SQL text (core.db.texts_param).
    with bound_cursor() as cursor:
        cursor.execute(
            _LOOKUP_SQL,
            [texts_param(dedup_keys), client_id, _cutoff()],
            # Planned with its values each time, as before this form: a generic plan of the earlier one, made while
            # the table was small, read the created_at index (0.9 s a batch of 1,000). Planning is per batch.
            prepare=False,
        )
        return {row[0]: (str(row[1]), row[2]) for row in cursor.fetchall()}


def notification_ids_by_key(*, client_ids: list[int], dedup_key: str) -> list[str]:
    """Return the ids of the notifications that hold `dedup_key` now, for any of `client_ids` (support search)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT notification_id FROM notifier_dedupkey WHERE client_id = ANY(%s) AND dedup_key = %s",
            [list(client_ids), dedup_key],
        )
        return [str(row[0]) for row in cursor.fetchall()]


def purge_expired(*, batch: int = PURGE_BATCH, max_batches: int = 1000) -> int:
    """Delete dedup keys older than DEDUP_WINDOW_HOURS, in short batches; return how many went."""
    cutoff = _cutoff()
    total = 0
    for _ in range(max_batches):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM notifier_dedupkey WHERE ctid = ANY(ARRAY(SELECT ctid FROM notifier_dedupkey"
                " WHERE created_at < %s LIMIT %s FOR UPDATE SKIP LOCKED))",
                [cutoff, batch],
            )
            done = cursor.rowcount
        total += done
        if done < batch:
            break
    return total
