"""Fan-out of topic notifications: page subscribers by keyset, write deliveries in bulk, publish in batches.

One run of `notifier.tasks.fanout_topic` processes a bounded number of pages of one lane and re-enqueues
itself, so a million-subscriber topic never holds a worker for minutes and memory stays one page deep. A large
topic is split at its first run into FANOUT_LANES ranges of subscription ids (FanoutLane rows, each with its
own checkpoint), whose runs go on at once on the fan-out worker's processes: while one lane's page is written
by PostgreSQL, another's is decided in Python. Per page of a lane:

1. read the page (`topic_id = %s AND id > cursor AND id <= upper ORDER BY id LIMIT n`, served by
   subscription_keyset_idx)
   with its recipients, their active push devices and the suppression list, in three queries;
2. plan every (recipient, channel, address) with `notifier.planning.delivery_plan()` (as accept does) and
   insert the deliveries and their first events in one statement
   (`INSERT … SELECT … FROM jsonb_array_elements(…) ON CONFLICT DO NOTHING`), `published_at` set for the
   queued ones, in a short transaction;
3. publish the page's queued deliveries (500 ids per message); if any insert conflicted (the page is being
   redone after a crash) the queued ids are selected again, so what a crash left unpublished goes now;
4. advance the lane's checkpoint (its `cursor`, with a compare-and-set on the old one) and the notification's
   `fanout_processed`, in one transaction. The last lane to find no more subscribers marks the notification
   done, under the notification's row lock, so exactly one does.

Crash points: before 2 commits nothing happened; between 2 and 4 the redone page inserts nothing new (the
unique target constraint) and republishes the page's queued deliveries (a second message for a delivery is
harmless: the worker's claim takes it once); after 4 the page is done. Two runs racing on one lane (a
redelivered message next to its successor) insert nothing twice and the loser of the compare-and-set stops.

A campaign's fan-out is paced at its `rate_per_second`: a run does one page, spreads the page's messages over
`queued / rate` seconds with broker-delayed countdowns, and re-enqueues itself to start when that page's last
message is due. Deliveries are therefore created at most one page ahead of their send time, which keeps a
pause or cancel cheap and effective.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from celery import current_app as celery_app
from django.conf import settings
from django.db import connection, reset_queries, transaction
from django.utils import timezone

from core.db import bound_cursor, json_rows
from core.queues import broker_recently_down, queue_name
from notifier import localtime, strategy
from notifier.campaigns.status import campaign_fanout_finished
from notifier.models import Campaign, Delivery, FanoutLane, Notification
from notifier.outbox import publish
from notifier.partitions import delivery_ids_of_notification
from notifier.planning import channel_addresses, delivery_plan
from notifier.reach import reach_record
from preferences.compliance import suppressed_addresses
from preferences.models import Recipient

logger = logging.getLogger(__name__)

FANOUT_TASK = "notifier.tasks.fanout_topic"
S = Delivery.Status


def _setting(name: str, default: float) -> float:
    """Read a tunable from Django settings (config/settings.py reads it from the environment), else `default`."""
    value = getattr(settings, name, None)
    return float(default if value is None else value)


def page_size() -> int:
    """Return how many subscribers one page takes (FANOUT_PAGE_SIZE, default 5,000)."""
    return max(1, int(_setting("FANOUT_PAGE_SIZE", 5000)))


def run_budget_seconds() -> float:
    """Return how long one task run keeps paging before it re-enqueues itself (FANOUT_RUN_SECONDS, default 5)."""
    return _setting("FANOUT_RUN_SECONDS", 5.0)


def pace_window_seconds() -> float:
    """Return how many seconds of sends one paced page covers at most (FANOUT_PACE_WINDOW_SECONDS, default 10)."""
    return _setting("FANOUT_PACE_WINDOW_SECONDS", 10.0)


def stall_seconds() -> float:
    """Return after how long without progress a fan-out counts as stalled (FANOUT_STALL_SECONDS, default 300)."""
    return _setting("FANOUT_STALL_SECONDS", 300.0)


def lanes_wanted() -> int:
    """Return into how many lanes a large topic is split (FANOUT_LANES, default 2)."""
    return max(1, int(_setting("FANOUT_LANES", 2)))


def lane_min_subscribers() -> int:
    """Return the topic size from which it is split into lanes (FANOUT_LANE_MIN_SUBSCRIBERS, default 50,000)."""
    return int(_setting("FANOUT_LANE_MIN_SUBSCRIBERS", 50_000))


def enqueue(notification_id: uuid.UUID | str, *, lane: int = 0, countdown: float | None = None) -> bool:
    """Publish one fan-out task for a lane of a notification; return False (and log) if the broker refused it."""
    options: dict[str, Any] = {"queue": "fanout", "retry": False}
    if countdown and countdown > 0:
        options["countdown"] = math.ceil(countdown)
    args: list[Any] = [str(notification_id)] if lane == 0 else [str(notification_id), lane]
    try:
        celery_app.send_task(FANOUT_TASK, args=args, **options)
    except Exception as exc:
        logger.error("fan-out of %s lane %d not enqueued (the sweeper will resume it): %s", notification_id, lane, exc)
        return False
    return True


def enqueue_unfinished(notification_id: uuid.UUID | str, *, countdown: float | None = None) -> int:
    """Enqueue a run for every lane of a notification not yet done (lane 0 before it is split); return how many."""
    lanes = list(FanoutLane.objects.filter(notification_id=notification_id, done=False).values_list("lane", flat=True))
    if not lanes and not FanoutLane.objects.filter(notification_id=notification_id).exists():
        lanes = [0]
    return sum(enqueue(notification_id, lane=lane, countdown=countdown) for lane in lanes)


def fanout_start(*, notification_id: uuid.UUID | str) -> None:
    """Start expanding a topic notification into deliveries (at its send_at, if that is in the future).

    Never raises: it runs after commit in the API request, and a fan-out that could not be enqueued is
    picked up by `fanout_sweep`.
    """
    if broker_recently_down():
        logger.warning("broker recently down; fan-out of %s left to the sweeper", notification_id)
        return
    send_at = Notification.objects.filter(pk=notification_id).values_list("send_at", flat=True).first()
    countdown = (send_at - timezone.now()).total_seconds() if send_at else None
    enqueue(notification_id, countdown=countdown)


@dataclass
class RunResult:
    """What one task run did; `next_in` is the countdown of the re-enqueued run, None when it stopped."""

    pages: int = 0
    subscribers: int = 0
    inserted: int = 0
    published: int = 0
    done: bool = False
    stopped: str = ""
    next_in: float | None = None


class PublishIncomplete(RuntimeError):
    """The broker did not take every message of a page; the page is redone (its checkpoint did not move)."""


def fanout_run(*, notification_id: uuid.UUID | str, lane: int = 0, enqueue_next: bool = True) -> RunResult:
    """Process pages of one lane of a topic notification for a bounded time, then re-enqueue the rest (or finish)."""
    result = RunResult()
    deadline = time.monotonic() + run_budget_seconds()
    while True:
        reset_queries()  # DEBUG keeps every query (with its 5,000-element arrays): keep memory flat anyway
        step = fanout_page(notification_id=notification_id, lane=lane)
        result.pages += 1 if step.subscribers else 0
        result.subscribers += step.subscribers
        result.inserted += step.inserted
        result.published += step.published
        if step.stopped or step.done:
            result.stopped, result.done = step.stopped, step.done
            return result
        if step.pace_seconds is not None:
            # A paced run does one page and comes back when that page's last message is due.
            result.next_in = step.pace_seconds
            break
        if time.monotonic() >= deadline:
            result.next_in = 0.0
            break
    if enqueue_next and not enqueue(notification_id, lane=lane, countdown=result.next_in):
        # The checkpoint is saved; the sweeper resumes from it.
        result.next_in = None
    return result


@dataclass
class PageResult:
    """What one page did."""

    subscribers: int = 0
    inserted: int = 0
    published: int = 0
    done: bool = False
    stopped: str = ""
    pace_seconds: float | None = None


_PAGE_SQL = """
    SELECT s.id, r.id, r.user_id, r.email, r.phone, r.webhook_url, r.timezone, r.opted_out, r.channel_prefs,
           r.category_prefs, r.quiet_start, r.quiet_end, r.erased_at
    FROM preferences_subscription s JOIN preferences_recipient r ON r.id = s.recipient_id
    WHERE s.topic_id = %s AND s.id > %s AND s.id <= %s
    ORDER BY s.id
    LIMIT %s
"""

# Deliveries and their first events in one round trip; only rows really inserted get an event. The page's
# targets travel as one JSON parameter of [recipient_id, channel, address, status, reason, not_before] rows.
_INSERT_SQL = """
    WITH ins AS (
        INSERT INTO notifier_delivery (
            id, notification_id, recipient_id, channel, priority, address, status, reason, not_before,
            published_at, provider, provider_message_id, attempts, last_error, created_at, updated_at
        )
        SELECT notifier_delivery_id(%s::timestamptz), %s, (e->>0)::bigint, e->>1, %s, e->>2, e->>3, e->>4,
               (e->>5)::timestamptz, CASE WHEN e->>3 = 'queued' THEN %s::timestamptz END, '', '', 0, '', %s, %s
        FROM jsonb_array_elements(%s::jsonb) AS e
        -- The partition's own unique index on (notification, recipient, channel, address) is the arbiter: a
        -- notification's deliveries all take its day (the id above), so a resumed page never doubles.
        ON CONFLICT DO NOTHING
        RETURNING id, channel, status, reason
    ), events AS (
        INSERT INTO notifier_deliveryevent (delivery_id, status, detail, at)
        SELECT id, status, reason, %s FROM ins
    )
    SELECT id, channel, status FROM ins
"""

_REQUEUED_SQL = """
    SELECT id, channel FROM notifier_delivery
    WHERE notification_id = %s AND id >= %s AND id < %s AND recipient_id = ANY(%s) AND status = 'queued'
      AND (not_before IS NULL OR not_before <= now())
    ORDER BY id
"""


class _Row:
    """The recipient fields compliance reads, without a model instance per subscriber (1M of them)."""

    __slots__ = (
        "category_prefs",
        "channel_prefs",
        "email",
        "erased_at",
        "opted_out",
        "phone",
        "pk",
        "quiet_end",
        "quiet_start",
        "timezone",
        "user_id",
        "webhook_url",
    )

    def __init__(self, row: Sequence[Any]) -> None:
        (
            self.pk,
            self.user_id,
            self.email,
            self.phone,
            self.webhook_url,
            self.timezone,
            self.opted_out,
            self.channel_prefs,
            self.category_prefs,
            self.quiet_start,
            self.quiet_end,
            self.erased_at,
        ) = row
        # Django's psycopg setup hands jsonb over as text (JSONField decodes it); so do we.
        self.channel_prefs = _json(self.channel_prefs)
        self.category_prefs = _json(self.category_prefs)


def _json(value: Any) -> Any:
    """Decode a jsonb column handed over as text; the common empty object without a parse."""
    if not isinstance(value, str):
        return value
    return {} if value == "{}" else json.loads(value)


def _stop_reason(notification_id: uuid.UUID, campaign_id: int | None, *, lock: bool) -> str:
    """Return why the fan-out must stop ("cancelled", "paused", "done", "missing") or ""."""
    status = Notification.objects.filter(pk=notification_id).values_list("status", flat=True).first()
    if status is None:
        return "missing"
    if status == Notification.Status.CANCELLED:
        return "cancelled"
    if status != Notification.Status.FANNING_OUT:
        return "done"
    if campaign_id is not None:
        if lock:
            # FOR SHARE until the page's insert commits: a pause (an UPDATE of this row) waits for the page
            # and then holds back what it inserted; a page started after the pause sees it here.
            with connection.cursor() as cursor:
                cursor.execute("SELECT status FROM notifier_campaign WHERE id = %s FOR SHARE", [campaign_id])
                row = cursor.fetchone()
            campaign_status = row[0] if row else None
        else:
            campaign_status = Campaign.objects.filter(pk=campaign_id).values_list("status", flat=True).first()
        if campaign_status == Campaign.Status.PAUSED:
            return "paused"
        if campaign_status == Campaign.Status.CANCELLED:
            return "cancelled"
    return ""


_NO_UPPER = 2**63 - 1


def _split(topic_id: int | None, lanes: int) -> list[int | None]:
    """Return the inclusive upper bounds of `lanes` ranges holding as many subscribers each (None: no bound).

    One index-only count and one keyset lookup per boundary: a few tens of milliseconds for a million.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM preferences_subscription WHERE topic_id = %s", [topic_id])
        total = cursor.fetchone()[0]
        if lanes < 2 or total < max(lane_min_subscribers(), lanes):
            return [None]
        bounds: list[int | None] = []
        for k in range(1, lanes):
            cursor.execute(
                "SELECT id FROM preferences_subscription WHERE topic_id = %s ORDER BY id OFFSET %s LIMIT 1",
                [topic_id, total * k // lanes - 1],
            )
            bounds.append(cursor.fetchone()[0])
    return [*bounds, None]


def _lane(n: Notification, lane: int) -> FanoutLane | None:
    """Return a lane of a fan-out; at the first run (lane 0) split the topic into lanes and start the others."""
    found = FanoutLane.objects.filter(notification_id=n.pk, lane=lane).first()
    if found is not None or lane != 0:
        return found
    with transaction.atomic():
        # The notification's row lock makes the split happen once, whoever gets here first.
        Notification.objects.select_for_update().filter(pk=n.pk).values_list("pk", flat=True).first()
        if not FanoutLane.objects.filter(notification_id=n.pk).exists():
            # A rate-capped campaign is paced page by page: one lane, so the cap holds over the whole topic.
            bounds = _split(n.topic_id, 1 if n.campaign_id is not None else lanes_wanted())
            lowers = [0, *bounds[:-1]]
            FanoutLane.objects.bulk_create(
                FanoutLane(notification_id=n.pk, lane=k, cursor=lower or 0, upper=upper)
                for k, (lower, upper) in enumerate(zip(lowers, bounds, strict=True))
            )
            others = range(1, len(bounds))

            def start_others() -> None:
                for k in others:
                    enqueue(n.pk, lane=k)

            transaction.on_commit(start_others)
    return FanoutLane.objects.filter(notification_id=n.pk, lane=0).first()


def fanout_page(*, notification_id: uuid.UUID | str, lane: int = 0) -> PageResult:
    """Process the next page of a lane of a topic notification: insert, publish, checkpoint (the module doc)."""
    n = (
        Notification.objects.filter(pk=notification_id)
        .select_related("client", "campaign")
        .only(
            "id",
            "created_at",
            "status",
            "topic_id",
            "category",
            "channels",
            "priority",
            "send_at",
            "send_at_local",
            "strategy",
            "fallback_until",
            "fallback_after_seconds",
            "fanout_processed",
            "client__webhook_url",
            "campaign__id",
            "campaign__rate_per_second",
            "campaign__timezone",
        )
        .first()
    )
    if n is None:
        return PageResult(stopped="missing")
    campaign_id = n.campaign_id
    stop = _stop_reason(n.pk, campaign_id, lock=False)
    if stop:
        return PageResult(stopped=stop)
    rate = n.campaign.rate_per_second if n.campaign is not None and n.campaign.rate_per_second else None
    # A subscriber without a time zone gets a local-time campaign at its named zone's time (others: UTC).
    fallback_zone = n.campaign.timezone if n.campaign is not None else ""
    size = page_size()
    if rate:
        per_subscriber = max(len(n.channels), 1)
        size = max(1, min(size, int(rate * pace_window_seconds() / per_subscriber)))
    current = _lane(n, lane)
    if current is None:
        return PageResult(stopped="missing")
    if current.done:
        return PageResult(stopped="lane done")
    cursor_before = current.cursor
    now = timezone.now()

    with transaction.atomic():
        # The page's commit need not wait for its WAL flush: the checkpoint below commits synchronously after
        # it, flushing the WAL in order, and until the checkpoint moves a lost page is simply done again.
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")
        if campaign_id is not None:
            stop = _stop_reason(n.pk, campaign_id, lock=True)
            if stop:
                return PageResult(stopped=stop)
        with bound_cursor() as cursor:
            upper = _NO_UPPER if current.upper is None else current.upper
            cursor.execute(_PAGE_SQL, [n.topic_id, cursor_before, upper, size])
            page = cursor.fetchall()
        if not page:
            return _finish(n, lane, cursor_before)
        recipients = [_Row(row[1:]) for row in page]
        devices: dict[int, list[str]] = defaultdict(list)
        if "push" in n.channels:
            with bound_cursor() as cursor:
                cursor.execute(
                    "SELECT recipient_id, token FROM preferences_device WHERE recipient_id = ANY(%s) AND active "
                    "ORDER BY id",
                    [[r.pk for r in recipients]],
                )
                for recipient_id, token in cursor.fetchall():
                    devices[recipient_id].append(token)
        webhook_default = n.client.webhook_url
        targets = [
            (r, channel, address)
            for r in recipients
            for channel in n.channels
            for address in channel_addresses(r, channel, webhook_default=webhook_default, tokens=devices.get(r.pk, []))
        ]
        dead = suppressed_addresses(list({(channel, address) for _, channel, address in targets if address}))
        rows: list[tuple[Any, ...]] = []
        for r, channel, address in targets:
            # send_at_local: that wall-clock time in this subscriber's time zone (notifier/localtime.py).
            send_at = localtime.send_at_for(n, r.timezone or fallback_zone) if n.send_at_local else n.send_at
            plan = delivery_plan(
                recipient=cast(Recipient, r),
                category=n.category,
                channel=channel,
                address=address,
                send_at=send_at,
                now=now,
                suppressed=(channel, address) in dead if address else False,
            )
            rows.append((r.pk, channel, address, plan.status, plan.reason, plan.not_before))
        # Smarter delivery hook (notifier/strategy.py): a fallback chain's later steps wait as pending.
        rows = strategy.plan_fanout_rows(n, rows, now)
        with bound_cursor() as cursor:
            cursor.execute(_INSERT_SQL, [n.created_at, n.pk, n.priority, now, now, now, json_rows(rows), now])
            inserted = cursor.fetchall()
        # Deliveries suppressed at fan-out are status changes too: events for the calling service, in bulk.
        reach_record([(row[0], row[2], "") for row in inserted if row[2] == S.SUPPRESSED], at=now)
    strategy.after_fanout_page(n, inserted, now)  # after commit: the timer for the pending steps
    queued = [(row[0], row[1]) for row in inserted if row[2] == S.QUEUED]
    if len(inserted) < len(targets):
        # Part of this page was written by an earlier run that did not reach its checkpoint: publish again
        # every delivery of the page still waiting, whoever inserted it.
        with bound_cursor() as cursor:
            low, high = delivery_ids_of_notification(n.created_at)
            cursor.execute(_REQUEUED_SQL, [n.pk, low, high, [r.pk for r in recipients]])
            queued = cursor.fetchall()
    published, pace = _publish_page(queued, priority=n.priority, rate=rate)
    if published < len(queued):
        raise PublishIncomplete(f"{len(queued) - published} of {len(queued)} deliveries not published")
    last_id = page[-1][0]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE notifier_fanoutlane SET cursor = %s, processed = processed + %s, updated_at = now() "
            "WHERE notification_id = %s AND lane = %s AND cursor = %s AND NOT done",
            [last_id, len(page), n.pk, lane, cursor_before],
        )
        moved = cursor.rowcount
        if moved:
            cursor.execute(
                "UPDATE notifier_notification SET fanout_processed = fanout_processed + %s, updated_at = now() "
                "WHERE id = %s AND status = 'fanning_out'",
                [len(page), n.pk],
            )
    result = PageResult(subscribers=len(page), inserted=len(inserted), published=published, pace_seconds=pace)
    if not moved:
        # Another run advanced this lane meanwhile: let that run carry on.
        result.stopped = "superseded"
    return result


def _publish_page(queued: list[tuple[int, str]], *, priority: str, rate: int | None) -> tuple[int, float | None]:
    """Publish a page's queued deliveries; at a rate cap, spread the messages with countdowns.

    Returns (how many were published, seconds the page's sends span at the rate cap, or None uncapped).
    """
    groups: dict[str, list[int]] = defaultdict(list)
    for delivery_id, channel in queued:
        groups[queue_name(channel, priority)].append(delivery_id)
    if not rate:
        return len(publish(groups)), None
    # At most one second's worth of sends per message, so the cap holds second by second, not just on average.
    chunk = max(1, min(settings.SEND_BATCH_SIZE, rate))
    published, offset = 0, 0
    for queue, ids in groups.items():
        for start in range(0, len(ids), chunk):
            part = ids[start : start + chunk]
            published += len(publish({queue: part}, countdown=offset / rate, batch_size=chunk))
            offset += len(part)
    return published, offset / rate


def _finish(n: Notification, lane: int, cursor_before: int) -> PageResult:
    """Mark a lane done (every subscriber of its range seen); the last lane marks the fan-out done."""
    with transaction.atomic(), connection.cursor() as cursor:
        # Under the notification's row lock, so that of two lanes finishing at once exactly one sees the other
        # done and marks the notification.
        cursor.execute("SELECT status FROM notifier_notification WHERE id = %s FOR UPDATE", [n.pk])
        cursor.execute(
            "UPDATE notifier_fanoutlane SET done = true, updated_at = now() "
            "WHERE notification_id = %s AND lane = %s AND cursor = %s AND NOT done",
            [n.pk, lane, cursor_before],
        )
        if not cursor.rowcount:
            return PageResult(stopped="superseded")
        cursor.execute(
            "UPDATE notifier_notification SET status = 'done', recipients_total = fanout_processed, updated_at = now() "
            "WHERE id = %s AND status = 'fanning_out' "
            "AND NOT EXISTS (SELECT 1 FROM notifier_fanoutlane WHERE notification_id = %s AND NOT done)",
            [n.pk, n.pk],
        )
        finished = cursor.rowcount
    if not finished:
        return PageResult(stopped="lane done")
    if n.campaign_id is not None:
        campaign_fanout_finished(campaign_id=n.campaign_id)
    return PageResult(done=True)


def fanout_sweep(*, limit: int = 100) -> int:
    """Re-enqueue fan-out lanes that made no progress for a while (a lost message, a broker outage).

    Returns how many runs were enqueued. A fan-out not yet split into lanes counts by its own `updated_at`.
    A duplicate run next to a live one is harmless (see the module doc); paused campaigns are left alone.
    """
    now = timezone.now()
    cutoff = now - timedelta(seconds=stall_seconds())
    live = Notification.objects.filter(status=Notification.Status.FANNING_OUT).exclude(send_at__gt=now)
    live = live.exclude(campaign__status__in=[Campaign.Status.PAUSED, Campaign.Status.CANCELLED])
    unsplit = list(
        live.filter(updated_at__lt=cutoff, fanout_lanes__isnull=True)
        .order_by("updated_at")
        .values_list("pk", flat=True)[:limit]
    )
    lanes = list(
        FanoutLane.objects.filter(done=False, updated_at__lt=cutoff, notification__in=live)
        .order_by("updated_at")
        .values_list("pk", "notification_id", "lane")[:limit]
    )
    Notification.objects.filter(pk__in=unsplit).update(updated_at=now)
    FanoutLane.objects.filter(pk__in=[pk for pk, _, _ in lanes]).update(updated_at=now)
    runs = [(notification_id, 0) for notification_id in unsplit] + [(nid, lane) for _, nid, lane in lanes]
    for notification_id, lane in runs:
        enqueue(notification_id, lane=lane)
    if runs:
        logger.warning("fan-out sweeper resumed %d stalled fan-out runs", len(runs))
    return len(runs)
