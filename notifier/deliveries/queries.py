"""Statements on the delivery log that other apps run: the send pipeline's loads, the fan-out's pages, the inbox's.

The send pipeline (channels_app.services) loads a claimed batch with its recipients and notifications in two
raw queries. The fan-out (notifier.dispatch.fanout) plans a page of a topic's subscribers; what it writes here
is the deliveries of that page with their first events, in one round trip, and the notification's progress.
The inbox stream server reads in-app items on asynchronous connections of its own: it takes the statements'
text from here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from core.db import RowLoader, bound_cursor, int_array, json_rows, span_prepare
from notifier.clients.models import ApiClient
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.partitions import delivery_ids_of_notification, notification_range
from preferences.models import Recipient

# The part both inserts share: the arbiter of a redone page, and the events of what was really inserted.
_INSERTED = """
        -- The partition's own unique index on (notification, recipient, channel, address) is the arbiter: a
        -- notification's deliveries all take its day (the id above), so a resumed page never doubles.
        ON CONFLICT DO NOTHING
        RETURNING id, channel, status, reason, recipient_id
    ), events AS (
        INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at)
"""
# Deliveries and their first events in one round trip; only rows really inserted get an event. The page's
# targets travel as one JSON parameter of [recipient_id, channel, address, status, reason, not_before] rows.
_INSERT_SQL = (
    """
    WITH ins AS (
        INSERT INTO notifier_delivery (
            id, notification_id, environment_id, recipient_id, channel, priority, address, status, reason,
            not_before, published_at, provider, provider_message_id, attempts, last_error, created_at, updated_at
        )
        SELECT notifier_delivery_id(%s::timestamptz), %s, %s, (e->>0)::bigint, e->>1, %s, e->>2, e->>3, e->>4,
               (e->>5)::timestamptz, CASE WHEN e->>3 = 'queued' THEN %s::timestamptz END, '', '', 0, '', %s, %s
        FROM jsonb_array_elements(%s::jsonb) AS e"""  # noqa: S608 - fixed text, no input
    + _INSERTED
    + """        SELECT id, status, reason, %s FROM ins
    )
    SELECT id, channel, status, reason, recipient_id FROM ins
"""
)
# The same for a page with in-app items the fan-out stores itself (notifier/inbox/fanout.py): those rows come
# as status `sent` with a seventh element, the index of their rendered content in a second parameter, and get
# the worker's fields and a `queued` event before their `sent` one. A page without any keeps the plain
# statement above (no materialized page, no extra columns).
_INSERT_STORED_SQL = (
    """
    WITH page AS (
        SELECT notifier_delivery_id(%s::timestamptz) AS id, e FROM jsonb_array_elements(%s::jsonb) AS e
    ), ins AS (
        INSERT INTO notifier_delivery (
            id, notification_id, environment_id, recipient_id, channel, priority, address, status, reason,
            not_before, published_at, provider, provider_message_id, attempts, last_error, created_at, updated_at,
            sent_at, content, template_version_id
        )
        SELECT p.id, %s, %s, (e->>0)::bigint, e->>1, %s, e->>2, e->>3, e->>4, (e->>5)::timestamptz,
               CASE WHEN e->>3 = 'queued' THEN %s::timestamptz END,
               CASE WHEN e->>3 = 'sent' THEN 'inapp' ELSE '' END,
               CASE WHEN e->>3 = 'sent' THEN 'inapp-' || p.id ELSE '' END,
               CASE WHEN e->>3 = 'sent' THEN 1 ELSE 0 END, '', %s, %s,
               CASE WHEN e->>3 = 'sent' THEN %s::timestamptz END,
               CASE WHEN e->>3 = 'sent' THEN (%s::jsonb)->((e->>6)::int) END,
               CASE WHEN e->>3 = 'sent' THEN %s::bigint END
        FROM page AS p"""  # noqa: S608 - fixed text, no input
    + _INSERTED
    + """        SELECT id, 'queued', '', %s FROM ins WHERE status = 'sent'
        UNION ALL
        SELECT id, status, CASE WHEN status = 'sent' THEN %s ELSE reason END, %s FROM ins
    )
    SELECT id, channel, status, reason, recipient_id FROM ins
"""
)

_REQUEUED_SQL = """
    SELECT id, channel FROM notifier_delivery
    WHERE notification_id = %s AND id >= %s AND id < %s AND recipient_id = ANY(%s) AND status = 'queued'
      AND (not_before IS NULL OR not_before <= now())
    ORDER BY id
"""


def page_deliveries_insert(
    n: Notification,
    rows: Sequence[tuple[Any, ...]],
    *,
    at: datetime,
    stored: tuple[list[dict[str, Any]], int | None, str] | None = None,
) -> list[tuple[Any, ...]]:
    """Insert a fan-out page's deliveries with their first events; return those inserted.

    `rows` are [recipient_id, channel, address, status, reason, not_before] (a stored in-app item: status `sent`
    and a seventh element, the index of its content). `stored` = (contents, template version id, sent detail)
    for a page with such items. A row the page already inserted (a redone page) is not inserted again. Each
    delivery inserted is returned as (id, channel, status, reason, recipient_id).
    """
    with bound_cursor() as cursor:
        if stored is not None:
            bodies, version_id, sent_detail = stored
            params = [
                n.created_at,
                json_rows(rows),
                n.pk,
                n.environment_id,
                n.priority,
                at,
                at,
                at,
                at,
                json.dumps(bodies),
            ]
            cursor.execute(_INSERT_STORED_SQL, [*params, version_id, at, sent_detail, at])
        else:
            cursor.execute(
                _INSERT_SQL, [n.created_at, n.pk, n.environment_id, n.priority, at, at, at, json_rows(rows), at]
            )
        return list(cursor.fetchall())


def page_deliveries_waiting(n: Notification, recipient_ids: Sequence[int]) -> list[tuple[int, str]]:
    """Return (id, channel) of the notification's queued deliveries to these recipients that are due now."""
    low, high = delivery_ids_of_notification(n.created_at)
    with bound_cursor() as cursor:
        cursor.execute(_REQUEUED_SQL, [n.pk, low, high, list(recipient_ids)])
        return [(int(row[0]), str(row[1])) for row in cursor.fetchall()]


def notification_lock(notification_id: Any) -> str | None:
    """Lock a notification's row until the transaction ends (FOR UPDATE); return its status."""
    with bound_cursor() as cursor:
        cursor.execute("SELECT status FROM notifier_notification WHERE id = %s FOR UPDATE", [notification_id])
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def notification_count_fanned_out(notification_id: Any, count: int) -> None:
    """Add a page's subscribers to a fanning-out notification's progress."""
    with bound_cursor() as cursor:
        cursor.execute(
            "UPDATE notifier_notification SET fanout_processed = fanout_processed + %s, updated_at = now() "
            "WHERE id = %s AND status = 'fanning_out'",
            [count, notification_id],
        )


def notification_fanout_done(notification_id: Any) -> bool:
    """Mark a fanning-out notification done, its total the subscribers seen; return whether it was fanning out."""
    with bound_cursor() as cursor:
        cursor.execute(
            "UPDATE notifier_notification SET status = 'done', recipients_total = fanout_processed, updated_at = now() "
            "WHERE id = %s AND status = 'fanning_out'",
            [notification_id],
        )
        return bool(cursor.rowcount)


# Timestamps the pipeline never reads stay in the database: parsing them was a tenth of a batch's time.
_DELIVERIES = RowLoader(Delivery, skip=("created_at", "updated_at", "claimed_at", "read_at"))
_RECIPIENTS = RowLoader(Recipient, skip=("created_at", "updated_at"))
_LOAD_SQL = (
    f"SELECT {_DELIVERIES.columns('d')}, {_RECIPIENTS.columns('r')} FROM notifier_delivery d"  # noqa: S608
    " JOIN preferences_recipient r ON r.id = d.recipient_id WHERE d.id = ANY(%s::bigint[])"
    " AND d.id BETWEEN %s AND %s"
)


_NOTIFICATIONS = RowLoader(Notification)
_CLIENTS = RowLoader(ApiClient)
_NOTIFICATIONS_SQL = (
    f"SELECT {_NOTIFICATIONS.columns('n')}, {_CLIENTS.columns('c')}"  # noqa: S608
    " FROM notifier_notification n JOIN notifier_apiclient c ON c.id = n.client_id"
    " WHERE n.id = ANY(%s::uuid[]) AND n.created_at BETWEEN %s AND %s"
)


def notifications_load_for_send(ids: set[Any]) -> dict[Any, Notification]:
    """Load a batch's notifications with their client (as select_related would), in one raw query.

    The queryset's compilation of the two joins was a third of a small batch's CPU. The ids' UUIDv7 times
    bound `created_at`, so the plan reads only their day's partition (notifier/deliveries/partitions.py).
    """
    ranges = [r for r in map(notification_range, ids) if r is not None]
    if not ranges:  # ids that are not UUIDv7 (made by hand): no time to bound them by
        return Notification.objects.select_related("client").in_bulk(ids)
    low, high = min(r[0] for r in ranges), max(r[1] for r in ranges)
    with bound_cursor() as cursor:
        cursor.execute(_NOTIFICATIONS_SQL, [[str(i) for i in ids], low, high])
        rows = cursor.fetchall()
    found: dict[Any, Notification] = {}
    n_width = _NOTIFICATIONS.width
    for row in rows:
        notification = _NOTIFICATIONS.build(row[:n_width])
        cache = notification._state.fields_cache
        cache["client"] = _CLIENTS.build(row[n_width:])
        found[notification.pk] = notification
    if len(found) < len(ids):  # an id outside its UUIDv7's day: the ORM finds it anywhere
        found |= Notification.objects.select_related("client").in_bulk(set(ids) - set(found))
    return found


def deliveries_load_for_send(ids: Sequence[int]) -> list[Delivery]:
    """Load claimed deliveries with their recipients (as select_related would), in one query."""
    with bound_cursor() as cursor:
        cursor.execute(_LOAD_SQL, [int_array(ids), min(ids), max(ids)], prepare=span_prepare(ids))
        rows = cursor.fetchall()
    width = _DELIVERIES.width
    deliveries = []
    for row in rows:
        delivery = _DELIVERIES.build(row[:width])
        delivery._state.fields_cache["recipient"] = _RECIPIENTS.build(row[width:])
        deliveries.append(delivery)
    return deliveries


# ---- the inbox stream server's reads (notifier.inbox.stream runs them on its own async connections) ----------
# The content's three fields as text: no JSON document parsed per item only to be written out again.
_INBOX_REST_COLUMNS = (
    "d.notification_id, d.content->>'title', d.content->>'body', d.content->>'url', n.category, d.status,"
    " d.created_at, d.read_at, d.archived_at"
)
_INBOX_ITEM_COLUMNS = f"d.id, {_INBOX_REST_COLUMNS}"
INBOX_SINCE_SQL = (
    f"SELECT {_INBOX_ITEM_COLUMNS} FROM notifier_delivery d JOIN notifier_notification n ON n.id = d.notification_id"  # noqa: S608
    " WHERE d.recipient_id = %s AND d.channel = %s AND d.status = ANY(%s) AND d.sent_at > %s"
    " ORDER BY d.sent_at, d.id LIMIT 500"
)
# The batched reads behind a burst of changes (a topic's in-app message): items and counts of many recipients.
# Items alike but for their id come as one row with the arrays of their ids and recipients: a topic's 1,000
# items are one row, encoded once, and two arrays of integers rather than 1,000 row tuples and UUIDs for the
# garbage collector to track. The ids' range bounds the partitions read; the notification (for its category)
# is looked up once per group by its key, never joined as a whole: a day's partition is new and without
# statistics every midnight, and a hash join then reads all of it.
INBOX_ITEMS_SQL = (
    "SELECT g.notification_id, g.title, g.body, g.url, n.category, g.status, g.created_at, g.read_at, g.archived_at,"
    " g.ids, g.recipients FROM ("
    " SELECT d.notification_id, d.content->>'title' AS title, d.content->>'body' AS body, d.content->>'url' AS url,"
    " d.status, d.created_at, d.read_at, d.archived_at,"
    " array_agg(d.id ORDER BY d.id) AS ids, array_agg(d.recipient_id ORDER BY d.id) AS recipients"
    " FROM notifier_delivery d WHERE d.id = ANY(%s::bigint[]) AND d.id BETWEEN %s AND %s AND d.channel = %s"
    " AND d.status = ANY(%s) GROUP BY 1, 2, 3, 4, 5, 6, 7, 8) AS g"
    " CROSS JOIN LATERAL (SELECT n.category FROM notifier_notification n WHERE n.id = g.notification_id OFFSET 0) AS n"
)
# A recipient's unread count, with the ids of the unread items among them sent in the last so many seconds
# (notifier/inbox/unread.py: an item counted here and notified afterwards is not counted again).
_RECENT_IDS = "array_agg(id) FILTER (WHERE sent_at > now() - make_interval(secs => %s))"
INBOX_UNREADS_SQL = (
    f"SELECT recipient_id, count(*), {_RECENT_IDS} FROM notifier_delivery WHERE recipient_id = ANY(%s::bigint[])"  # noqa: S608
    " AND channel = %s AND status = ANY(%s) AND read_at IS NULL GROUP BY recipient_id"
)
INBOX_UNREAD_SQL = (
    f"SELECT count(*), {_RECENT_IDS} FROM notifier_delivery WHERE recipient_id = %s AND channel = %s"  # noqa: S608
    " AND status = ANY(%s) AND read_at IS NULL"
)
