"""Carry status changes to whoever listens: the calling service's event endpoint and open inbox streams.

One call per batch of status changes (`reach_record`), made where they are recorded (notifier/deliveries/status.py
`record_events`, which the send pipeline's outcome writer, `transition` and the callbacks all use, and the
fan-out's insert). It runs one statement, however large the batch: an INSERT … SELECT of the status events
joined to the clients that have an endpoint, and pg_notify of the in-app items stored or read, both of which
commit (or roll back) with the status change itself. Nothing here calls out of the database: the events are
sent by their own workers on their own queue (notifier/statusevents).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from celery import current_app
from django.db import transaction
from django.utils import timezone
from redis.exceptions import RedisError

from core import task_names
from core.db import bound_cursor, json_rows
from core.queues import broker_recently_down, ensure_topology, mark_broker_down
from core.redis_guard import get_redis, rkey

log = logging.getLogger(__name__)

# Delivery statuses a client can subscribe to, as "delivery.<status>" events (docs/reach.md).
EVENT_STATUSES = ("sent", "delivered", "opened", "clicked", "failed", "bounced", "suppressed")
FAILURE_STATUSES = ("failed", "bounced", "suppressed")
# The NOTIFY channel the inbox stream servers LISTEN on. A payload lists changes separated by commas, each
# "<recipient_id>:<delivery_id>" for a new item or "<recipient_id>:" for a change of the unread count only;
# a batch of changes makes one NOTIFY per NOTIFY_BATCH of them (a fan-out page's 5,000 items: 28, not 5,000
# messages for PostgreSQL to queue and every stream server to read one by one). 180 changes of at most 40
# characters (two 19-digit ids) stay under PostgreSQL's 8,000-byte payload limit.
INBOX_CHANNEL = "notifier_inbox"
NOTIFY_BATCH = 180
INBOX_STATUSES = ("sent", "opened")
EVENTS_QUEUE = "events"
WAKE_COALESCE_MS = 1000
_INTERESTING = frozenset(EVENT_STATUSES) | frozenset(INBOX_STATUSES)

# Each change's delivery (and each distinct notification) is found by its key, one probe per row
# (`LATERAL … OFFSET 0` keeps the planner from turning the probes into a join): a day's partition is new and
# without statistics every midnight, and the planner, guessing it nearly empty, otherwise compared each change
# with every in-app row of the day (5,000 changes of a fan-out page by 10,000 rows took seconds) or scanned
# every partition of the notifications.
_SQL = """
    WITH v AS (
        SELECT (e->>0)::bigint AS id, e->>1 AS status, e->>2 AS detail FROM jsonb_array_elements(%s::jsonb) AS e
    ), dv AS MATERIALIZED (
        SELECT v.id, v.status, v.detail, d.recipient_id, d.channel, d.notification_id, d.reason, d.provider_message_id
        FROM v CROSS JOIN LATERAL (
            SELECT d.recipient_id, d.channel, d.notification_id, d.reason, d.provider_message_id
            FROM notifier_delivery d WHERE d.id = v.id OFFSET 0
        ) AS d
    ), nv AS MATERIALIZED (
        SELECT n.id, n.client_id, n.dedup_key, n.user_id
        FROM (SELECT DISTINCT notification_id FROM dv) AS x CROSS JOIN LATERAL (
            SELECT n.id, n.client_id, n.dedup_key, n.user_id FROM notifier_notification n
            WHERE n.id = x.notification_id OFFSET 0
        ) AS n
    ), ev AS (
        INSERT INTO notifier_statusevent (endpoint_id, delivery_id, type, data, at, state, attempts)
        SELECT ep.id, dv.id, 'delivery.' || dv.status,
               jsonb_build_object(
                   'notification_id', n.id, 'delivery_id', dv.id, 'channel', dv.channel, 'status', dv.status,
                   'reason', CASE WHEN dv.status IN ('failed', 'bounced', 'suppressed')
                                  THEN COALESCE(NULLIF(dv.reason, ''), left(dv.detail, 255)) ELSE '' END,
                   'provider_message_id', dv.provider_message_id, 'dedup_key', n.dedup_key, 'user_id', n.user_id),
               %s, 'pending', 0
        FROM dv
        JOIN nv n ON n.id = dv.notification_id
        JOIN notifier_eventendpoint ep ON ep.client_id = n.client_id AND ep.is_active AND dv.status = ANY(ep.statuses)
        ORDER BY dv.id
        RETURNING endpoint_id
    ), changes AS (
        SELECT dv.recipient_id::text || ':' || CASE WHEN dv.status = 'sent' THEN dv.id::text ELSE '' END AS change,
               (row_number() OVER (ORDER BY dv.id) - 1) / %s AS part
        FROM dv
        WHERE dv.channel = 'inapp' AND dv.status IN ('sent', 'opened')
    ), nt AS (
        SELECT pg_notify(%s, string_agg(change, ',')) FROM changes GROUP BY part
    )
    SELECT (SELECT count(*) FROM nt), ARRAY(SELECT DISTINCT endpoint_id FROM ev)
"""


def reach_record(rows: Iterable[tuple[int, str, str]], *, at: datetime | None = None) -> list[int]:
    """Turn (delivery_id, status, detail) changes into status events and inbox notifications; one statement.

    Returns the endpoints that got events; their senders are woken after commit.
    """
    wanted = [(d, s, detail) for d, s, detail in rows if s in _INTERESTING]
    if not wanted:
        return []
    with bound_cursor() as cursor:
        cursor.execute(_SQL, [json_rows(wanted), at or timezone.now(), NOTIFY_BATCH, INBOX_CHANNEL])
        row = cursor.fetchone()
        assert row is not None  # the statement always answers one row
        _, endpoints = row
    endpoints = list(endpoints or [])
    if endpoints:
        transaction.on_commit(lambda: status_events_wake(endpoint_ids=endpoints))
    return endpoints


def status_events_wake(*, endpoint_ids: Iterable[int], countdown: int | None = None, force: bool = False) -> None:
    """Ask the event workers to send these endpoints' pending events (at most one wake per endpoint a second).

    A burst of batches for one endpoint thus makes one broker message, not one per batch; a sender that is
    already running for the endpoint picks the new events up itself. A `countdown` (a backoff) or `force`
    (a sender handing over to a fresh task) always publishes. Never raises: what is not woken, the periodic
    sweep wakes. Published by task name: the sender
    lives above this layer (channels_app.statusevents), next to the webhook adapter it uses.
    """

    if broker_recently_down():
        return  # like the outbox: no connection timeout per batch while the broker is away; the sweep wakes
    redis = get_redis()
    try:
        if countdown:
            ensure_topology()
        for endpoint_id in endpoint_ids:
            if countdown is None and not force:
                try:
                    if not redis.set(rkey("evwake", endpoint_id), "1", nx=True, px=WAKE_COALESCE_MS):
                        continue
                except RedisError:
                    pass  # without Redis, wake every time: more messages, nothing missed
            # Delayed delivery counts whole seconds (a countdown under one second is no countdown).
            current_app.send_task(
                task_names.SEND_STATUS_EVENTS,
                args=[endpoint_id],
                queue=EVENTS_QUEUE,
                countdown=countdown or None,
                retry=False,
            )
    except Exception:  # the sweep wakes them anyway; a broker hiccup must not fail a committed change
        mark_broker_down()
        log.warning("could not wake status event senders; the sweep will", exc_info=True)
