"""Hand deliveries to RabbitMQ, and the relay that makes the delivery row itself the outbox.

The API publishes right after commit (the fast path). Whatever that misses — the broker was down, the process
died between commit and publish — is still `queued` with no `published_at`, and the relay publishes it. The
same relay wakes deliveries that were waiting for a time (send_at, quiet hours, a long backoff).
Publishing twice is harmless: the worker's claim takes a delivery only once.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, cast

from celery import current_app as celery_app
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core import metrics, task_names, tracing
from core.db import bound_cursor, int_array, span_prepare
from core.queues import broker_recently_down, ensure_topology, mark_broker_down, queue_name
from notifier.deliveries.models import Delivery
from notifier.deliveries.status import deliveries_wake_due

logger = logging.getLogger(__name__)


def _chunks(ids: Sequence[int], size: int) -> Iterable[list[int]]:
    for start in range(0, len(ids), size):
        yield list(ids[start : start + size])


# A publish that fails is tried again, PUBLISH_RETRY_PAUSE_SECONDS apart, before its ids are left to the relay. Each try
# lets kombu reconnect at once on a connection error, to the next node of the failover list (KOMBU_FAILOVER), so the
# loss of the node a publisher sits on costs one reconnect. The pauses are for what follows: the nodes left nack every
# publish to a quorum queue whose leader died until they have elected a new one (2 s on a quiet cluster of three, 4 s
# on a loaded one). Callers give up after PUBLISH_RETRY_SECONDS; the API's coalescer keeps trying as long as the relay
# would take (its grace, a quarter of OUTBOX_REPUBLISH_AFTER_SECONDS), which never leaves a row later than giving up
# would. Decision 0103.
PUBLISH_RETRY_SECONDS = 1.0
PUBLISH_RETRY_PAUSE_SECONDS = 0.25
KOMBU_FAILOVER: dict[str, Any] = {
    "retry": True,
    "retry_policy": {"max_retries": 2, "interval_start": 0, "interval_step": 0, "interval_max": 0},
}


def publish(
    groups: dict[str, list[int]],
    *,
    countdown: float | None = None,
    batch_size: int | None = None,
    retry_seconds: float = PUBLISH_RETRY_SECONDS,
) -> list[int]:
    """Publish delivery ids grouped by queue, `batch_size` ids per message; return the ids published.

    Raises nothing: a failure is tried again for `retry_seconds`, then logged, and the ids not published are left
    to the relay.
    """
    size = batch_size or settings.SEND_BATCH_SIZE
    published: list[int] = []
    options: dict[str, Any] = dict(KOMBU_FAILOVER)
    if countdown and countdown > 0:
        # Whole seconds, rounded up: native delayed delivery routes by seconds, and arriving a little late is
        # fine where arriving early would find the delivery not yet due.
        options["countdown"] = math.ceil(countdown)
    # High priority first: an OTP never waits behind a bulk message, nor behind the retries of one.
    pending = sorted(
        ((queue, chunk) for queue, ids in groups.items() for chunk in _chunks(ids, size)),
        key=lambda item: not item[0].endswith(".high"),
    )
    give_up_at = time.monotonic() + retry_seconds
    try:
        if "countdown" in options:
            ensure_topology()
        while pending:
            try:
                with celery_app.producer_or_acquire() as producer:
                    while pending:
                        queue, chunk = pending[0]
                        _send(producer, queue, chunk, options)
                        published.extend(chunk)
                        pending.pop(0)
            except Exception as exc:
                if time.monotonic() + PUBLISH_RETRY_PAUSE_SECONDS > give_up_at:
                    raise
                logger.warning("publish to %s failed, trying again: %r", pending[0][0], exc.__cause__ or exc)
                if len(pending) > 1 and not pending[0][0].endswith(".high"):
                    pending.append(pending.pop(0))  # another queue's leader may be there: try its messages first
                time.sleep(PUBLISH_RETRY_PAUSE_SECONDS)
    except Exception as exc:  # any broker failure (including channel errors) leaves the rows to the relay
        mark_broker_down()
        logger.error("publish failed; %d deliveries left to the outbox relay: %s", _count(groups, published), exc)
    return published


def _send(producer: Any, queue: str, chunk: list[int], options: dict[str, Any]) -> None:
    # argsrepr: Celery would otherwise saferepr() 500 ids per message for its logs and Flower.
    argsrepr = f"[<{len(chunk)} delivery ids {chunk[0]}..{chunk[-1]}>]"
    with tracing.span(
        f"publish {queue}",
        kind="producer",
        **{"messaging.destination.name": queue, "notifier.deliveries": len(chunk)},
    ):
        celery_app.send_task(
            task_names.SEND_DELIVERIES, args=[chunk], queue=queue, producer=producer, argsrepr=argsrepr, **options
        )


def _count(groups: dict[str, list[int]], published: list[int]) -> int:
    return sum(len(ids) for ids in groups.values()) - len(published)


def group_by_queue(rows: Iterable[tuple[int, str, str]]) -> dict[str, list[int]]:
    """Group (id, channel, priority) rows by their queue name."""
    groups: dict[str, list[int]] = defaultdict(list)
    for delivery_id, channel, priority in rows:
        groups[queue_name(channel, priority)].append(delivery_id)
    return groups


# The ids' span as constants prunes to their day's partition (notifier/deliveries/partitions.py). `= ANY` costs one
# probe or one hashed test per row whatever the statistics say (core.db.int_array says why not a semi-join). The rows
# are taken FOR UPDATE SKIP LOCKED in a sub-select, so the mark never waits: a row locked now is being claimed (it is
# no longer waiting for its message) or marked by another publisher, and a mark waiting on a claim that waits on
# another of its rows was a deadlock (the claim locks in id order, an UPDATE in whatever order its scan reads).
# A row left unmarked that is still queued later is published again by the relay; the claim makes that harmless.
_MARK_SQL = (
    "UPDATE notifier_delivery SET published_at = now() WHERE id = ANY(ARRAY("
    " SELECT id FROM notifier_delivery WHERE id = ANY(%s::bigint[]) AND id BETWEEN %s AND %s{also}"
    " FOR UPDATE SKIP LOCKED)) AND id BETWEEN %s AND %s"
)
MARK_PUBLISHED_SQL = _MARK_SQL.format(also="")


# The coalescer's mark, a second after the publish: what a worker claimed meanwhile no longer needs it. The status
# is tested as `status || ''` so that the outbox's partial index (`WHERE status = 'queued'`) cannot serve it: with
# statistics from before a burst, the planner took that index for small and read every queued row of the day
# (a campaign's million) to mark two; the primary key reads only the ids given.
MARK_STILL_QUEUED_SQL = _MARK_SQL.format(also=" AND status || '' = 'queued'")
# How long the coalescer waits before marking what it published. Most singles are claimed by then, so their rows
# are not written again; the relay leaves an unmarked row alone for OUTBOX_REPUBLISH_AFTER_SECONDS / 4 (10 s by
# default), far beyond this.
MARK_AFTER_SECONDS = 1.0


def mark_published(ids: Sequence[int], *, still_queued: bool = False) -> None:
    """Record that a message for these deliveries is in the broker (the relay leaves them alone).

    On the database's clock, like every time the relay compares it with. One raw statement: as a queryset
    update, compiling it was 5 % of the API's CPU under single sends (the coalescer marks every publish). A row
    locked by someone else right now is skipped, never waited for (MARK_PUBLISHED_SQL says why).
    """
    if ids:
        sql = MARK_STILL_QUEUED_SQL if still_queued else MARK_PUBLISHED_SQL
        with bound_cursor() as cursor:
            low, high = min(ids), max(ids)
            cursor.execute(sql, [int_array(ids), low, high, low, high], prepare=span_prepare(ids))


def publish_now(rows: Iterable[tuple[int, str, str]], *, countdown: float | None = None) -> list[int]:
    """Publish (id, channel, priority) rows and record the publish; skip while the broker is known down."""
    if broker_recently_down():
        return []
    published = publish(group_by_queue(rows), countdown=countdown)
    mark_published(published)
    return published


class Coalescer:
    """Publishes accepted deliveries from a background thread, many requests' ids per broker message.

    The request thread only hands its (id, channel, priority) rows over and returns: it never waits for a
    broker confirm. A high-priority row (an OTP) is published at once, with whatever else is waiting; while a
    publish is in flight the ids of the requests that arrive meanwhile gather and leave together, one message
    per queue (up to SEND_BATCH_SIZE ids), consumed by the workers' bulk claim. Normal- and low-priority rows
    also wait up to PUBLISH_LINGER_MS for company before they leave: under a burst of singles a message then
    carries many ids, and the broker, this thread and the send worker pay their per-message costs once for
    all of them. `published_at` is set only after the broker confirmed, and MARK_AFTER_SECONDS later, in one
    statement for everything published meanwhile and only on rows still `queued`: a single is usually claimed
    by then, and its row is not written a second time for nothing. Rows whose publish never happened, or whose
    mark was lost with the process, are the relay's, as before (a second message is harmless: claims are
    idempotent).
    """

    def __init__(self) -> None:
        self._rows: list[tuple[int, str, str]] = []
        # The submitting requests' span contexts: the publish continues (or links to) their traces.
        self._contexts: list[Any] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._busy = False
        # Published, not yet marked, and when the oldest of them is due to be marked.
        self._to_mark: list[int] = []
        self._mark_at = 0.0
        # When the oldest row waiting arrived, and whether a high-priority one is among them (it ends the wait).
        self._since = 0.0
        self._urgent = False
        # Set while the process exits: publish and mark what is waiting now, without lingering.
        self._flushing = False

    def submit(self, rows: Iterable[tuple[int, str, str]]) -> None:
        """Queue rows for publishing; return at once."""
        rows = list(rows)
        if not rows:
            return
        span_context = tracing.current_span_context()
        urgent = any(priority == "high" for _, _, priority in rows)
        with self._cond:
            if not self._rows:
                self._since = time.monotonic()
            self._rows.extend(rows)
            self._urgent = self._urgent or urgent
            if span_context is not None:
                self._contexts.append(span_context)
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="outbox-coalescer", daemon=True)
                self._thread.start()
            self._cond.notify()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until everything submitted so far is published (or given up to the relay); for tests."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._rows or self._busy or self._to_mark:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def flush(self, timeout: float = 5.0) -> bool:
        """Publish and mark everything submitted so far at once, as the process exits; return whether it was done.

        Without it a server stopping gracefully would answer its last requests and leave their deliveries to
        the relay, published only after the relay's grace period.
        """
        with self._cond:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                return not self._rows
            self._flushing = True
            self._mark_at = 0.0
            self._cond.notify_all()
        try:
            return self.wait_idle(timeout)
        finally:
            with self._cond:
                self._flushing = False

    def _linger_left(self) -> float:
        """Return how much longer the rows waiting may wait for company (0: publish now); hold the lock."""
        linger = settings.PUBLISH_LINGER_MS / 1000
        if linger <= 0 or self._urgent or self._flushing or len(self._rows) >= settings.SEND_BATCH_SIZE:
            return 0.0
        return max(0.0, self._since + linger - time.monotonic())

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._rows or (left := self._linger_left()) > 0:
                    if self._to_mark and time.monotonic() >= self._mark_at:
                        break
                    if self._rows:
                        self._cond.wait(left)
                        continue
                    self._busy = False
                    self._cond.notify_all()
                    self._cond.wait(max(0.0, self._mark_at - time.monotonic()) if self._to_mark else None)
                rows, self._rows = self._rows, []
                contexts, self._contexts = self._contexts, []
                self._urgent = False
                self._busy = True
            try:
                if rows and not broker_recently_down():
                    with tracing.continue_from(contexts):
                        published = publish(
                            group_by_queue(rows), retry_seconds=settings.OUTBOX_REPUBLISH_AFTER_SECONDS / 4
                        )
                    if published and not self._to_mark and not self._flushing:
                        self._mark_at = time.monotonic() + MARK_AFTER_SECONDS
                    self._to_mark.extend(published)
                if self._to_mark and time.monotonic() >= self._mark_at:
                    marking, self._to_mark = self._to_mark, []
                    mark_published(marking, still_queued=True)
            except Exception as exc:  # the relay publishes whatever this missed
                logger.error("background publish failed; %d deliveries left to the relay: %s", len(rows), exc)
                connection.close()


coalescer = Coalescer()
# The publisher is a daemon thread, which dies with the interpreter: what it still holds then is published first
# (a server stopping gracefully, a worker recycled after max_requests).
atexit.register(coalescer.flush)


def publish_soon(rows: Iterable[tuple[int, str, str]]) -> None:
    """Hand committed deliveries to the per-process publisher (the API's path: no confirm in the request)."""
    if settings.PUBLISH_IN_BACKGROUND:
        coalescer.submit(rows)
    else:
        publish_now(rows)


def publish_delivery_ids(delivery_ids: Sequence[int]) -> list[int]:
    """Publish the given deliveries (loading their channel and priority); return the ids published."""
    rows = Delivery.objects.filter(pk__in=list(delivery_ids)).values_list("id", "channel", "priority")
    return publish_now(list(rows))


def relay(*, limit: int | None = None) -> dict[str, int]:
    """Publish what the fast path missed and wake deliveries that are now due; return counts.

    Rows are taken with FOR UPDATE SKIP LOCKED so two relays (two beat processes, a manual run) never take
    the same row at once, and in bounded batches so no lock is long.
    """
    limit = limit or settings.OUTBOX_RELAY_BATCH
    now = timezone.now()
    unpublished = _relay_unpublished(limit=limit)
    woken = _wake_due(limit=limit, now=now)
    stale = _relay_stale(limit=limit)
    lost = _relay_lost(limit=limit)
    if unpublished or stale or lost:
        metrics.count_republished(unpublished + stale + lost)
    if unpublished or woken or stale or lost:
        logger.info(
            "outbox relay: %d unpublished, %d due, %d stale, %d lost re-published", unpublished, woken, stale, lost
        )
    return {"unpublished": unpublished, "due": woken, "stale": stale, "lost": lost}


def _relay_unpublished(*, limit: int) -> int:
    # The grace period keeps the relay from racing the API's own after-commit publish.
    sql = """
        SELECT id, channel, priority FROM notifier_delivery
        WHERE status = 'queued' AND published_at IS NULL AND created_at < now() - make_interval(secs => %s)
          AND (not_before IS NULL OR not_before <= now())
        ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, [settings.OUTBOX_REPUBLISH_AFTER_SECONDS / 4, limit])
        rows = cursor.fetchall()
        published = publish(group_by_queue(rows))
        mark_published(published)
    return len(published)


def _wake_due(*, limit: int, now: object) -> int:
    rows = deliveries_wake_due(limit=limit, overdue_after=settings.OUTBOX_REPUBLISH_AFTER_SECONDS)
    if not rows:
        return 0
    published = publish(group_by_queue(rows))
    mark_published(published)
    return len(rows)


def _relay_stale(*, limit: int) -> int:
    # Last line of defence: a message that was published but never consumed within the stale window (or a
    # delivery whose worker died mid-send, past its lease). Re-publishing is harmless: claims are idempotent.
    sql = """
        SELECT id, channel, priority FROM notifier_delivery
        WHERE (status = 'queued' AND published_at < now() - make_interval(secs => %s))
           OR (status = 'sending' AND claimed_at < now() - make_interval(secs => %s))
        ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, [settings.OUTBOX_STALE_AFTER_SECONDS, settings.SENDING_LEASE_SECONDS, limit])
        rows = cursor.fetchall()
        published = publish(group_by_queue(rows))
        mark_published(published)
    return len(published)


def _ready_messages(queues: Iterable[str]) -> dict[str, int | None]:
    """Return the ready messages of each queue (None where the broker could not say)."""
    depths: dict[str, int | None] = {}
    try:
        with celery_app.connection_for_write() as conn:
            channel = conn.channel()
            for name in queues:
                queue = celery_app.amqp.queues.get(name)
                if queue is None:
                    depths[name] = None
                    continue
                try:
                    # A passive declare answers (name, messages, consumers); kombu's stubs also allow str/None.
                    _, count, _ = cast("tuple[str, int, int]", queue(channel).queue_declare(passive=True))
                    depths[name] = int(count)
                except Exception:
                    depths[name] = None
                    channel = conn.channel()
    except Exception as exc:
        logger.warning("outbox relay: queue depths unavailable: %s", exc)
    return depths


def _relay_lost(*, limit: int) -> int:
    """Re-publish deliveries published a while ago, still `queued`, whose queue holds nothing ready.

    Their message is gone (a task dead-lettered while the database was away, a purge, a broker that lost it):
    nothing in the broker will ever bring them to a worker. A queue with a backlog is left alone (the message
    may be waiting in it; the stale window is the last resort there). A duplicate message is harmless.
    """
    sql = """
        SELECT id, channel, priority FROM notifier_delivery
        WHERE status = 'queued' AND published_at < now() - make_interval(secs => %s)
          AND (not_before IS NULL OR not_before <= now())
        ORDER BY published_at LIMIT %s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [settings.OUTBOX_REPUBLISH_AFTER_SECONDS, limit])
        rows = cursor.fetchall()
    if not rows:
        return 0
    groups = group_by_queue(rows)
    depths = _ready_messages(groups)
    lost = {queue: ids for queue, ids in groups.items() if depths.get(queue) == 0}
    if not lost:
        return 0
    published = publish(lost)
    mark_published(published)
    return len(published)
