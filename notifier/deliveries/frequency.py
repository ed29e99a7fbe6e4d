"""Frequency caps: at most `max` notifications of a category per recipient in `per_seconds`, on any channel.

A category opts in with `frequency_cap: {"max": 3, "per_seconds": 86400}` in NOTIFIER_CATEGORIES (none has
one by default, so security and transactional are never capped unless an operator says so). What is counted
is a notification to a recipient, whichever and however many channels it uses: a push and an email of the same
notification are one message from the recipient's point of view, and a fallback chain is one notification.

Two counters, one decision each time:

- Redis (the fast path): a sorted set per (category, recipient) of notification ids scored by Redis' own
  clock, trimmed and checked and appended in one Lua script, so concurrent accepts on any number of API
  processes cannot both take the last slot. A notification already in the set is admitted again without
  counting twice, which is what makes the worker's re-check and redelivered messages harmless.
- PostgreSQL (the truth when Redis is unreachable): the count of the recipient's recent notifications of that
  category that were not suppressed, cancelled or skipped, taken under a transaction-scoped advisory lock on
  (category, recipient) inside the accept transaction, so concurrent accepts queue on the lock and each counts
  the rows the previous ones committed. On the worker the database answer is "was this one of the first `max`
  in the window, by creation time", which needs no lock.

Checked at accept (the delivery rows are written `suppressed`, reason `frequency_cap`) and again on the worker
right before sending (for topics that is the only check: the fan-out writes their deliveries), or, for the
in-app items of a topic the fan-out stores itself (notifier/inbox/fanout.py), by the fan-out page.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import redis
from django.conf import settings
from django.db import connection

from core.db import bound_cursor, json_rows
from core.redis_guard import redis_script, rkey
from preferences.models import CHANNEL_ADDRESS_USER_ID

if TYPE_CHECKING:  # types only: the models import this module's callers
    from notifier.deliveries.models import Delivery, Notification
    from preferences.models import Recipient

logger = logging.getLogger(__name__)

REASON = "frequency_cap"
# Statuses that mean "we decided not to send it": they do not use up the recipient's allowance.
NOT_COUNTED = ("suppressed", "cancelled", "skipped")
# Statuses of a delivery at accept that will still be sent later (and so count).
LIVE = ("queued", "scheduled", "deferred", "pending")

_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local window = tonumber(ARGV[1])
local max = tonumber(ARGV[2])
local admitted = {}
for i = 1, #KEYS do
  local key, member = KEYS[i], ARGV[2 + i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  if redis.call('ZSCORE', key, member) then
    admitted[2 * i - 1] = 1
  elseif redis.call('ZCARD', key) < max then
    redis.call('ZADD', key, now, member)
    redis.call('EXPIRE', key, math.ceil(window) + 60)
    admitted[2 * i - 1] = 1
  else
    admitted[2 * i - 1] = 0
  end
  -- How many the window holds now (with this one if admitted): why a throttle decided as it did.
  admitted[2 * i] = redis.call('ZCARD', key)
end
return admitted
"""


@dataclass(frozen=True)
class Cap:
    """A category's allowance: `max` notifications per recipient in `per_seconds`."""

    max: int
    per_seconds: int


def cap_of(category: str) -> Cap | None:
    """Return the frequency cap configured for `category`, or None (not capped)."""
    rules = settings.NOTIFIER_CATEGORIES.get(category) or {}
    # Settings JSON (settings.NOTIFIER_CATEGORIES): a {"max", "per_seconds"} object when configured.
    cap: Any = rules.get("frequency_cap") if isinstance(rules, dict) else None
    if not cap:
        return None
    return Cap(max=int(cap["max"]), per_seconds=int(cap["per_seconds"]))


def validate_caps(categories: dict[str, Any]) -> list[str]:
    """Return what is wrong with the frequency caps of a NOTIFIER_CATEGORIES value (for the settings check)."""
    problems = []
    for name, rules in categories.items():
        cap = (rules or {}).get("frequency_cap")
        if cap is None:
            continue
        ok = isinstance(cap, dict) and set(cap) == {"max", "per_seconds"}
        ok = ok and all(isinstance(cap[k], int) and cap[k] > 0 for k in ("max", "per_seconds"))
        if not ok:
            problems.append(f"{name}: frequency_cap must be {{'max': int > 0, 'per_seconds': int > 0}}")
    return problems


def _key(category: str, recipient_id: int) -> str:
    return rkey("fcap", category, recipient_id)


def _redis_admit_counted(cap: Cap, category: str, pairs: Sequence[tuple[int, str]]) -> list[tuple[bool, int]]:
    """Admit (recipient id, member) pairs in one script call; return (admitted, count in the window) for each.

    Raises redis.RedisError if Redis is down.
    """
    keys = [_key(category, rid) for rid, _ in pairs]
    result = redis_script(_ADMIT)(keys=keys, args=[cap.per_seconds, cap.max, *[nid for _, nid in pairs]])
    return [(bool(int(result[2 * i])), int(result[2 * i + 1])) for i in range(len(pairs))]


def _redis_admit(cap: Cap, category: str, pairs: Sequence[tuple[int, str]]) -> list[bool]:
    """Admit (recipient id, notification id) pairs in one script call; raise redis.RedisError if Redis is down."""
    return [admitted for admitted, _ in _redis_admit_counted(cap, category, pairs)]


def admit_one(
    *, scope: str, cap: Cap, recipient_id: int, member: str, count_in_db: Callable[[], int]
) -> tuple[bool, int]:
    """Admit `member` into the recipient's allowance under `scope`; return (admitted, count in the window).

    The frequency caps' two counters for any other per-recipient allowance (a workflow's throttle): Redis
    first; without Redis `count_in_db()` counts what was already admitted, and must run inside a transaction
    that holds a lock serialising the recipient's admissions (it is called under the advisory lock taken here).
    """
    try:
        return _redis_admit_counted(cap, scope, [(recipient_id, member)])[0]
    except redis.RedisError as exc:
        logger.warning("allowance fast path degraded, counting in the database: %s", type(exc).__name__)
    assert connection.in_atomic_block, "the database count needs a transaction to hold its lock"
    with bound_cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext('fcap'), hashtext(%s))", [f"{scope}:{recipient_id}"])
    count = count_in_db()
    return (count < cap.max, count + 1 if count < cap.max else count)


def _lock_and_count(cap: Cap, category: str, recipient_id: int) -> int:
    """Take the (category, recipient) advisory lock for this transaction; count the notifications in the window."""
    with bound_cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext('fcap'), hashtext(%s))", [f"{category}:{recipient_id}"])
        cursor.execute(
            "SELECT count(DISTINCT d.notification_id) FROM notifier_delivery d"
            " JOIN notifier_notification n ON n.id = d.notification_id"
            " WHERE d.recipient_id = %s AND n.category = %s"
            " AND d.created_at > clock_timestamp() - make_interval(secs => %s)"
            " AND d.status <> ALL(%s::text[])",
            [recipient_id, category, cap.per_seconds, list(NOT_COUNTED)],
        )
        row = cursor.fetchone()
        assert row is not None  # count() always answers one row
        return int(row[0])


def admit_at_accept(*, category: str, recipient_id: int, notification_id: str, earlier: int = 0) -> bool:
    """Return whether one more notification of `category` may go to the recipient now, and count it if so.

    Must run inside the accept transaction: without Redis, the advisory lock it takes is held until commit, and
    `earlier` (what this accept admitted for the recipient before, not yet written) is added to the count.
    """
    cap = cap_of(category)
    if cap is None:
        return True
    try:
        return _redis_admit(cap, category, [(recipient_id, notification_id)])[0]
    except redis.RedisError as exc:
        logger.warning("frequency cap fast path degraded, counting in the database: %s", type(exc).__name__)
    assert connection.in_atomic_block, "the database count needs the accept transaction to hold its lock"
    return _lock_and_count(cap, category, recipient_id) + earlier < cap.max


def counted_at_accept(category: str, deliveries: Sequence[Delivery]) -> list[Delivery]:
    """Return the deliveries of a new notification that make it count against its recipient's allowance.

    None for a category without a cap. Only a notification that would reach the recipient is counted: one whose
    deliveries are all suppressed anyway (opted out, no address) uses no allowance.
    """
    if cap_of(category) is None:
        return []
    return [d for d in deliveries if d.status in LIVE]


def refuse(deliveries: Sequence[Delivery]) -> None:
    """Suppress deliveries whose recipient's allowance is used up (reason frequency_cap)."""
    for d in deliveries:
        d.status, d.reason, d.not_before = "suppressed", REASON, None


def apply_at_accept(
    notification: Notification, recipient: Recipient, deliveries: Sequence[Delivery], *, earlier: int = 0
) -> None:
    """Suppress a new notification's deliveries (reason frequency_cap) when the recipient's allowance is used up.

    `earlier`: notifications this accept admitted for the recipient before this one (`admit_at_accept`).
    """
    live = counted_at_accept(notification.category, deliveries)
    if not live:
        return
    if admit_at_accept(
        category=notification.category, recipient_id=recipient.pk, notification_id=str(notification.pk),
        earlier=earlier,
    ):  # fmt: skip
        return
    refuse(live)


def recheck_on_worker(deliveries: list[Delivery], suppress: Callable[[Delivery, str], None]) -> list[Delivery]:
    """Return the deliveries still within their recipient's cap; hand the others to `suppress(delivery, reason)`.

    One Redis script call per capped category in the batch (or one database query without Redis), never one
    per delivery.
    """
    by_category: dict[str, list[Delivery]] = {}
    for d in deliveries:
        # A team's channel address is nobody's allowance (the holder recipient is shared by every such send).
        if cap_of(d.notification.category) is not None and d.recipient.user_id != CHANNEL_ADDRESS_USER_ID:
            by_category.setdefault(d.notification.category, []).append(d)
    if not by_category:
        return deliveries
    refused: set[int] = set()
    for category, group in by_category.items():
        cap = cap_of(category)
        assert cap is not None
        rows = {(d.recipient_id, str(d.notification_id)): d.notification.created_at for d in group}
        verdicts = _verdicts(cap, category, rows)
        refused.update(d.pk for d in group if not verdicts[(d.recipient_id, str(d.notification_id))])
    kept = []
    for d in deliveries:
        if d.pk in refused:
            suppress(d, REASON)
        else:
            kept.append(d)
    return kept


def refused_recipients(
    *, category: str, notification_id: str, created_at: datetime, recipient_ids: Sequence[int]
) -> set[int]:
    """Return the recipients whose cap refuses one notification: the worker's re-check, for a fan-out page at once.

    The same counters as recheck_on_worker (the notification is counted once per recipient, however often asked).
    """
    cap = cap_of(category)
    if cap is None or not recipient_ids:
        return set()
    rows = {(rid, notification_id): created_at for rid in dict.fromkeys(recipient_ids)}
    verdicts = _verdicts(cap, category, rows)
    return {rid for (rid, _), admitted in verdicts.items() if not admitted}


def _verdicts(cap: Cap, category: str, rows: dict[tuple[int, str], datetime]) -> dict[tuple[int, str], bool]:
    """Admit (recipient id, notification id) pairs: one Redis script call, or one database query without Redis."""
    pairs = list(rows)
    try:
        return dict(zip(pairs, _redis_admit(cap, category, pairs), strict=True))
    except redis.RedisError as exc:
        logger.warning("frequency cap fast path degraded, counting in the database: %s", type(exc).__name__)
    return _database_verdicts(cap, category, rows)


def _database_verdicts(cap: Cap, category: str, rows: dict[tuple[int, str], datetime]) -> dict[tuple[int, str], bool]:
    """Decide without Redis: a notification passes if fewer than `max` earlier ones of the category count.

    `rows` map (recipient id, notification id) to the notification's creation time.
    """
    sql = """
        SELECT (e->>0)::bigint, e->>1, (
            SELECT count(DISTINCT d.notification_id) FROM notifier_delivery d
            JOIN notifier_notification n ON n.id = d.notification_id
            WHERE d.recipient_id = (e->>0)::bigint AND n.category = %s
              AND d.created_at > clock_timestamp() - make_interval(secs => %s)
              AND d.status <> ALL(%s::text[])
              AND n.created_at < (e->>2)::timestamptz AND n.id <> (e->>1)::uuid
        ) FROM jsonb_array_elements(%s::jsonb) AS e
    """
    with bound_cursor() as cursor:
        cursor.execute(
            sql,
            [category, cap.per_seconds, list(NOT_COUNTED), json_rows((r, n, at) for (r, n), at in rows.items())],
        )
        return {(int(r), str(n)): int(count) < cap.max for r, n, count in cursor.fetchall()}
