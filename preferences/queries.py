"""Statements on subscriptions and recipients that other apps run: a topic's subscribers, page by page."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from django.db.models.expressions import RawSQL

from core.db import bound_cursor

_PAGE_SQL = """
    SELECT s.id, r.id, r.user_id, r.email, r.phone, r.webhook_url, r.timezone, r.opted_out, r.channel_prefs,
           r.category_prefs, r.quiet_start, r.quiet_end, r.erased_at, r.locale, r.chat
    FROM preferences_subscription s JOIN preferences_recipient r ON r.id = s.recipient_id
    WHERE s.topic_id = %s AND s.id > %s AND s.id <= %s
    ORDER BY s.id
    LIMIT %s
"""


def subscriber_page(cursor: Any, *, topic_id: int | None, after: int, upper: int, size: int) -> list[tuple[Any, ...]]:
    """Return up to `size` subscribers of a topic with subscription ids in (after, upper], in id order.

    Each row: the subscription id, then the recipient's id, user_id, email, phone, webhook_url, timezone,
    opted_out, channel_prefs, category_prefs, quiet_start, quiet_end, erased_at, locale and chat addresses.
    """
    cursor.execute(_PAGE_SQL, [topic_id, after, upper, size])
    return list(cursor.fetchall())


def subscriber_count(topic_id: int | None) -> int:
    """Return how many subscriptions a topic has (an index-only count)."""
    with bound_cursor() as cursor:
        cursor.execute("SELECT count(*) FROM preferences_subscription WHERE topic_id = %s", [topic_id])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def subscription_at(topic_id: int | None, offset: int) -> int:
    """Return the id of a topic's subscription at `offset` in id order (a keyset boundary)."""
    with bound_cursor() as cursor:
        cursor.execute(
            "SELECT id FROM preferences_subscription WHERE topic_id = %s ORDER BY id OFFSET %s LIMIT 1",
            [topic_id, offset],
        )
        row = cursor.fetchone()
    if row is None:
        raise ValueError(f"topic {topic_id} has no subscription at offset {offset}")
    return int(row[0])


def device_tokens(recipient_ids: Sequence[int]) -> dict[int, list[str]]:
    """Return the active push tokens of these recipients, oldest device first."""
    tokens: dict[int, list[str]] = defaultdict(list)
    with bound_cursor() as cursor:
        cursor.execute(
            "SELECT recipient_id, token FROM preferences_device WHERE recipient_id = ANY(%s) AND active ORDER BY id",
            [list(recipient_ids)],
        )
        for recipient_id, token in cursor.fetchall():
            tokens[recipient_id].append(token)
    return tokens


def recipients_at_local_hour(at: dt.datetime, hour: int) -> RawSQL:
    """Return a subquery of the recipients for whom `at` falls in local hour `hour` (no time zone: UTC).

    Time zones are validated when stored (preferences), and PostgreSQL's zone database is the IANA one too.
    """
    return RawSQL(
        "SELECT id FROM preferences_recipient WHERE extract(hour FROM %s::timestamptz AT TIME ZONE"
        " coalesce(nullif(timezone, ''), 'UTC')) = %s",
        [at, hour],
    )
