"""Carry status changes to whoever listens: the calling service's event endpoint and open inbox streams.

One call per batch of status changes (`reach_record`), made where they are recorded (notifier/events.py
`record_events`, which the send pipeline's outcome writer, `transition` and the callbacks all use, and the
fan-out's insert). It runs one statement, however large the batch: an INSERT … SELECT of the status events
joined to the clients that have an endpoint, and a pg_notify per in-app item stored or read, both of which
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

from core.db import bound_cursor, json_rows
from core.queues import broker_recently_down, ensure_topology, mark_broker_down
from core.redis_guard import get_redis, rkey

log = logging.getLogger(__name__)

# Delivery statuses a client can subscribe to, as "delivery.<status>" events (API.md).
EVENT_STATUSES = ("sent", "delivered", "opened", "clicked", "failed", "bounced", "suppressed")
FAILURE_STATUSES = ("failed", "bounced", "suppressed")
# The NOTIFY channel the inbox stream servers LISTEN on; payload "<recipient_id>:<delivery_id>" for a new
# item, "<recipient_id>:" for a change of the unread count only.
INBOX_CHANNEL = "notifier_inbox"
INBOX_STATUSES = ("sent", "opened")
EVENTS_QUEUE = "events"
SEND_TASK = "channels_app.tasks.send_status_events"
WAKE_COALESCE_MS = 1000
_INTERESTING = frozenset(EVENT_STATUSES) | frozenset(INBOX_STATUSES)

_SQL = """
    WITH v AS (
        SELECT (e->>0)::bigint AS id, e->>1 AS status, e->>2 AS detail FROM jsonb_array_elements(%s::jsonb) AS e
    ), ev AS (
        INSERT INTO notifier_statusevent (endpoint_id, delivery_id, type, data, at, state, attempts)
        SELECT ep.id, d.id, 'delivery.' || v.status,
               jsonb_build_object(
                   'notification_id', n.id, 'delivery_id', d.id, 'channel', d.channel, 'status', v.status,
                   'reason', CASE WHEN v.status IN ('failed', 'bounced', 'suppressed')
                                  THEN COALESCE(NULLIF(d.reason, ''), left(v.detail, 255)) ELSE '' END,
                   'provider_message_id', d.provider_message_id, 'dedup_key', n.dedup_key, 'user_id', n.user_id),
               %s, 'pending', 0
        FROM v
        JOIN notifier_delivery d ON d.id = v.id
        JOIN notifier_notification n ON n.id = d.notification_id
        JOIN notifier_eventendpoint ep ON ep.client_id = n.client_id AND ep.is_active AND v.status = ANY(ep.statuses)
        ORDER BY v.id
        RETURNING endpoint_id
    ), nt AS (
        SELECT pg_notify(%s, d.recipient_id::text || ':' || CASE WHEN v.status = 'sent' THEN d.id::text ELSE '' END)
        FROM v JOIN notifier_delivery d ON d.id = v.id
        WHERE d.channel = 'inapp' AND v.status IN ('sent', 'opened')
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
        cursor.execute(_SQL, [json_rows(wanted), at or timezone.now(), INBOX_CHANNEL])
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
                SEND_TASK, args=[endpoint_id], queue=EVENTS_QUEUE, countdown=countdown or None, retry=False
            )
    except Exception:  # the sweep wakes them anyway; a broker hiccup must not fail a committed change
        mark_broker_down()
        log.warning("could not wake status event senders; the sweep will", exc_info=True)
