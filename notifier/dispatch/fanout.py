"""Fan-out of topic notifications: page subscribers by keyset, write deliveries in bulk, publish in batches.

One run of `notifier.tasks.fanout_topic` processes a bounded number of pages of one lane and re-enqueues
itself, so a million-subscriber topic never holds a worker for minutes and memory stays one page deep. A large
topic is split at its first run into FANOUT_LANES ranges of subscription ids (FanoutLane rows, each with its
own checkpoint), whose runs go on at once on the fan-out worker's processes: while one lane's page is written
by PostgreSQL, another's is decided in Python. Per page of a lane:

1. read the page (`topic_id = %s AND id > cursor AND id <= upper ORDER BY id LIMIT n`, served by
   subscription_keyset_idx)
   with its recipients, their active push devices and the suppression list, in three queries;
2. plan every (recipient, channel, address) with `notifier.deliveries.planning.delivery_plan()` (as accept does) and
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

import functools
import json
import logging
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, cast

from celery import current_app as celery_app
from django.conf import settings
from django.db import connection, reset_queries, transaction
from django.utils import timezone
from kombu.exceptions import OperationalError as KombuOperationalError

from core import task_names
from core.db import bound_cursor
from core.queues import broker_recently_down, queue_name
from notifier.deliveries import fallback
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.outbox import publish
from notifier.deliveries.planning import channel_addresses, delivery_plan
from notifier.deliveries.queries import (
    notification_count_fanned_out,
    notification_fanout_done,
    notification_lock,
    page_deliveries_insert,
    page_deliveries_waiting,
)
from notifier.dispatch import localtime, pace, shares
from notifier.dispatch.models import FanoutLane
from notifier.statusevents.record import reach_record
from preferences.compliance import suppressed_addresses
from preferences.models import Recipient
from preferences.queries import device_tokens, subscriber_count, subscriber_page, subscription_at
from projects.selectors import environment_project_weight

logger = logging.getLogger(__name__)

S = Delivery.Status

# Writers of a page for notifications that fan out into something else than deliveries, by their `strategy`
# (a workflow's runs): writer(notification, [(recipient_id, user_id)], now) -> rows written. Apps above this
# module register theirs at start-up; it cannot import them.
PageWriter = Callable[[Notification, list[tuple[int, str]], datetime], int]
_page_writers: dict[str, PageWriter] = {}


def register_page_writer(strategy_name: str, writer: PageWriter) -> None:
    """Have topic notifications of `strategy_name` fan out through `writer` instead of into deliveries."""
    _page_writers[strategy_name] = writer


class StoredChannel(Protocol):
    """A channel whose items a page stores as sent itself, in its own transaction (the inbox's in-app items).

    Registered by the app that owns the channel (`register_stored_channel`), which sits above this module.
    """

    CHANNEL: str
    SENT_DETAIL: str

    def eligible(self, n: Notification) -> bool:
        """Return whether this notification's items of the channel are stored by its pages."""
        ...

    def store_rows(
        self, n: Notification, rows: list[tuple[Any, ...]], locales: Sequence[str]
    ) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]], int | None]:
        """Mark the page rows stored as sent; return the rows, their contents and the template version id."""
        ...

    def after_commit(self, n: Notification, stored: int, at: datetime, ids: Sequence[int] = ()) -> None:
        """Count the stored items once the page committed."""
        ...


_stored_channels: list[StoredChannel] = []


class CampaignGate(Protocol):
    """What the fan-out asks of the campaign a topic notification belongs to (registered by the campaigns app)."""

    # Statuses of a campaign whose fan-outs the sweep leaves alone.
    HELD_STATUSES: tuple[str, ...]

    def campaign_stop_reason(self, campaign_id: int, *, lock: bool) -> str:
        """Return "paused" or "cancelled" when the campaign holds its fan-out back, else ""."""
        ...

    def campaign_fanout_finished(self, *, campaign_id: int) -> None:
        """Record that the campaign's run finished its fan-out."""
        ...


_campaign_gates: list[CampaignGate] = []


def register_campaign_gate(gate: CampaignGate) -> None:
    """Have fan-outs of campaign notifications ask `gate` whether to stop, and tell it when they finish."""
    _campaign_gates[:] = [gate]


def _campaign_gate() -> CampaignGate:
    if not _campaign_gates:
        raise RuntimeError("no campaign gate registered (the campaigns app is not installed)")
    return _campaign_gates[0]


def register_stored_channel(channel: StoredChannel) -> None:
    """Have topic pages store `channel`'s items themselves (one channel at most: the last registered)."""
    _stored_channels[:] = [channel]


def _stored_channel(n: Notification) -> StoredChannel | None:
    """Return the stored channel of this notification's pages, or None when every item goes through a queue."""
    channel = _stored_channels[0] if _stored_channels else None
    return channel if channel is not None and channel.eligible(n) else None


def _setting(name: str, default: float) -> float:
    """Read a tunable from Django settings (config/settings.py reads it from the environment), else `default`."""
    value = getattr(settings, name, None)
    return float(default if value is None else value)


def page_size() -> int:
    """Return how many subscribers one page takes (FANOUT_PAGE_SIZE, default 5,000)."""
    return max(1, int(_setting("FANOUT_PAGE_SIZE", 5000)))


def runs_page_size() -> int:
    """Return the most runs a page of a workflow trigger writes (FANOUT_RUNS_PAGE_SIZE, default 1,000)."""
    return max(1, int(_setting("FANOUT_RUNS_PAGE_SIZE", 1000)))


def run_budget_seconds() -> float:
    """Return how long one task run keeps paging before it re-enqueues itself (FANOUT_RUN_SECONDS, default 5)."""
    return _setting("FANOUT_RUN_SECONDS", 5.0)


def pace_window_seconds() -> float:
    """Return how many seconds of sends one paced page covers at most (FANOUT_PACE_WINDOW_SECONDS, default 10)."""
    return _setting("FANOUT_PACE_WINDOW_SECONDS", 10.0)


def stall_seconds() -> float:
    """Return after how long without progress a fan-out counts as stalled (FANOUT_STALL_SECONDS, default 30)."""
    return _setting("FANOUT_STALL_SECONDS", 30.0)


def lanes_wanted() -> int:
    """Return into how many lanes a large topic is split (FANOUT_LANES, default 2)."""
    return max(1, int(_setting("FANOUT_LANES", 2)))


def lane_min_subscribers() -> int:
    """Return the topic size from which it is split into lanes (FANOUT_LANE_MIN_SUBSCRIBERS, default 10,000)."""
    return int(_setting("FANOUT_LANE_MIN_SUBSCRIBERS", 10_000))


def enqueue(notification_id: uuid.UUID | str, *, lane: int = 0, countdown: float | None = None) -> bool:
    """Publish one fan-out task for a lane of a notification; return False (and log) if the broker refused it."""
    options: dict[str, Any] = {"queue": "fanout", "retry": False}
    if countdown and countdown > 0:
        options["countdown"] = math.ceil(countdown)
    args: list[Any] = [str(notification_id)] if lane == 0 else [str(notification_id), lane]
    for attempt in (1, 2):
        try:
            celery_app.send_task(task_names.FANOUT_TOPIC, args=args, **options)
            return True
        except Exception as exc:
            # A pooled connection the broker dropped (a restart, a node lost) fails its first publish; a second
            # attempt takes a fresh one. A broker that is really down refuses that one at once.
            if attempt == 1 and isinstance(exc, ConnectionError | KombuOperationalError):
                continue
            logger.error("fan-out of %s lane %d not enqueued (the sweeper resumes it): %s", notification_id, lane, exc)
            return False
    return False


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


# How long a run waits at most for room in a throttled queue before it makes way for other lanes, and how long
# it pauses before doing so when it was another broadcast's turn (so a waiting lane does not spin).
HOLD_SLEEP_SECONDS = 0.3
TURN_SLEEP_SECONDS = 0.1


class PublishIncomplete(RuntimeError):
    """The broker did not take every message of a page; the page is redone (its checkpoint did not move)."""


def fanout_run(*, notification_id: uuid.UUID | str, lane: int = 0, enqueue_next: bool = True) -> RunResult:
    """Process pages of one lane of a topic notification for a bounded time, then re-enqueue the rest (or finish)."""
    result = RunResult()
    deadline = time.monotonic() + run_budget_seconds()
    # A page's bookkeeping (the in-app items' metrics and audit lines: 0.1 s for 5,000) is done once the next
    # page has committed: the next page's items reach their screens that much sooner.
    later: list[Callable[[], None]] = []
    held = False
    try:
        while True:
            reset_queries()  # DEBUG keeps every query (with its 5,000-element arrays): keep memory flat anyway
            this_page: list[Callable[[], None]] = []
            try:
                step = fanout_page(notification_id=notification_id, lane=lane, later=this_page)
            finally:
                # A page that failed after its commit (publish, checkpoint) still has its items counted below.
                _run_all(later)
                later = this_page
            result.pages += 1 if step.subscribers else 0
            result.subscribers += step.subscribers
            result.inserted += step.inserted
            result.published += step.published
            if step.stopped or step.done:
                result.stopped, result.done = step.stopped, step.done
                return result
            if step.hold is not None:
                # No room in a throttled queue, or another broadcast's turn. Room comes back within the horizon:
                # wait for it once, briefly; then make way for the other lanes waiting for a fan-out process.
                if step.hold.reason == "room" and not held:
                    held = True
                    time.sleep(min(step.hold.wait, HOLD_SLEEP_SECONDS))
                    continue
                if step.hold.reason == "turn":
                    time.sleep(TURN_SLEEP_SECONDS)
                result.next_in = step.hold.wait if step.hold.wait > 1 else 0.0
                break
            if step.contended:
                # A fed page: go to the back of the fan-out queue, so that lanes of other broadcasts get their
                # turn at the fan-out processes too (a lone broadcast's next run starts at once).
                result.next_in = 0.0
                break
            if step.pace_seconds is not None:
                # A paced run does one page and comes back when that page's last message is due.
                result.next_in = step.pace_seconds
                break
            if time.monotonic() >= deadline:
                result.next_in = 0.0
                break
    finally:
        _run_all(later)
    if enqueue_next and not enqueue(notification_id, lane=lane, countdown=result.next_in):
        # The checkpoint is saved; the sweeper resumes from it.
        result.next_in = None
    return result


def _run_all(work: list[Callable[[], None]]) -> None:
    """Run a page's deferred bookkeeping; a failure is logged, never the page's (it has committed)."""
    for job in work:
        try:
            job()
        except Exception:
            logger.exception("a fan-out page's bookkeeping after commit failed")
    work.clear()


@dataclass
class PageResult:
    """What one page did."""

    subscribers: int = 0
    inserted: int = 0
    published: int = 0
    done: bool = False
    stopped: str = ""
    pace_seconds: float | None = None
    # Set when a throttled queue had no room or turn for this broadcast: nothing was written.
    hold: shares.Share | None = None
    # Whether the run makes way after this page: other broadcasts wanted its throttled queue too, or the page wrote
    # runs whose advance messages it queued on the fan-out queue (the lane's next page then waits behind them).
    contended: bool = False


class _Row:
    """The recipient fields compliance reads, without a model instance per subscriber (1M of them)."""

    __slots__ = (
        "category_prefs",
        "channel_prefs",
        "chat",
        "email",
        "erased_at",
        "locale",
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
            self.locale,
            self.chat,
        ) = row
        # Django's psycopg setup hands jsonb over as text (JSONField decodes it); so do we.
        self.channel_prefs = _json(self.channel_prefs)
        self.category_prefs = _json(self.category_prefs)
        self.chat = _json(self.chat)


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
        return _campaign_gate().campaign_stop_reason(campaign_id, lock=lock)
    return ""


_NO_UPPER = 2**63 - 1


def _split(topic_id: int | None, lanes: int) -> list[int | None]:
    """Return the inclusive upper bounds of `lanes` ranges holding as many subscribers each (None: no bound).

    One index-only count and one keyset lookup per boundary: a few tens of milliseconds for a million.
    """
    total = subscriber_count(topic_id)
    if lanes < 2 or total < max(lane_min_subscribers(), lanes):
        return [None]
    bounds: list[int | None] = [subscription_at(topic_id, total * k // lanes - 1) for k in range(1, lanes)]
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


# What a page reads of its notification (with the client and the campaign), and nothing more.
_PAGE_FIELDS = (
    "id", "created_at", "status", "topic_id", "category", "channels", "priority", "send_at", "send_at_local",
    "strategy", "fallback_until", "fallback_after_seconds", "fanout_processed", "locale", "template_key",
    "template_version", "payload", "trace_id", "environment", "client__webhook_url", "client__mode",
    "campaign__id", "campaign__rate_per_second", "campaign__timezone",
)  # fmt: skip


def fanout_page(
    *, notification_id: uuid.UUID | str, lane: int = 0, later: list[Callable[[], None]] | None = None
) -> PageResult:
    """Process the next page of a lane of a topic notification: insert, publish, checkpoint (the module doc).

    The steps: read the notification and stop if it was cancelled or paused; find the lane; size the page (the
    campaign's rate, the high queues' pace, a page of workflow runs); wait for room in a throttled queue (fair
    shares); write, publish and checkpoint the page. With `later`, the bookkeeping after the page's commit that
    nothing else waits for (the stored in-app items' metrics and audit lines) is appended to it for the caller to
    run, instead of run here.
    """
    n = Notification.objects.filter(pk=notification_id).select_related("client", "campaign").only(*_PAGE_FIELDS).first()
    if n is None:
        return PageResult(stopped="missing")
    stop = _stop_reason(n.pk, n.campaign_id, lock=False)
    if stop:
        return PageResult(stopped=stop)
    current = _lane(n, lane)
    if current is None:
        return PageResult(stopped="missing")
    if current.done:
        return PageResult(stopped="lane done")
    # In-app items the fan-out stores itself (notifier/inbox/fanout.py) never enter a queue.
    direct = _stored_channel(n)
    channels = [c for c in n.channels if not (direct is not None and c == direct.CHANNEL)]
    rate = n.campaign.rate_per_second if n.campaign is not None and n.campaign.rate_per_second else None
    size = _page_size(n, channels, rate)
    if isinstance(size, PageResult):
        return size
    writes_runs = n.strategy in _page_writers
    gate = _gate_open(n, channels, size) if n.priority != "high" and not writes_runs and shares.enabled() else None
    if gate is not None:
        if gate.hold is not None:
            return PageResult(hold=gate.hold)
        size = gate.size
    # A subscriber without a time zone gets a local-time campaign at its named zone's time (others: UTC).
    fallback_zone = n.campaign.timezone if n.campaign is not None else ""
    fed: dict[str, int] = defaultdict(int)
    try:
        result = _page(n, lane, current, size, rate, fallback_zone, direct, later, fed)
        result.contended = writes_runs or (gate is not None and gate.contended)
        return result
    finally:
        if gate is not None:
            gate.settle(fed)


def _page_size(n: Notification, channels: list[str], rate: int | None) -> int | PageResult:
    """Return how many subscribers the next page takes, or the wait when a high-priority fan-out is ahead of its pace.

    A campaign's rate: a pace window's worth of its subscribers. A high-priority fan-out fills the high queues no
    faster than their pace (notifier/dispatch/pace.py): while the reservations of every fan-out reach further
    ahead than a pace window, it comes back later instead of writing deliveries that could not be sent yet;
    otherwise it takes a page of at most one window's worth. A page of workflow runs is written ~10 times faster
    than its runs advance, and their advance messages go on the fan-out queue every project's fan-outs and
    workflow steps share: a lane writes one page of at most FANOUT_RUNS_PAGE_SIZE runs per task run and
    re-enqueues itself behind that page's advance messages, so another project's page or step waits behind about
    one page of runs per active lane, not the whole topic. (A broadcast at normal or low priority is sized again
    by the room in its throttled queues: `_gate_open`.)
    """
    size = page_size()
    if rate:
        size = max(1, min(size, int(rate * pace_window_seconds() / max(len(n.channels), 1))))
    paced = pace.paced_channels(channels) if n.priority == "high" else []
    if paced:
        window = pace_window_seconds()
        ahead = pace.seconds_ahead(paced)
        if ahead > window:
            return PageResult(pace_seconds=ahead - window)
        size = max(1, min(size, int(min(pace.pace_for(c) for c in paced) * window)))
    if n.strategy in _page_writers:
        size = min(size, runs_page_size())
    return size


def _page(
    n: Notification,
    lane: int,
    current: FanoutLane,
    size: int,
    rate: int | None,
    fallback_zone: str,
    direct: StoredChannel | None,
    later: list[Callable[[], None]] | None,
    fed: dict[str, int],
) -> PageResult:
    """Write, publish and checkpoint one page of `size` subscribers; count what was published per channel in `fed`."""
    campaign_id = n.campaign_id
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
            page = subscriber_page(cursor, topic_id=n.topic_id, after=cursor_before, upper=upper, size=size)
        if not page:
            return _finish(n, lane, cursor_before)
        writer = _page_writers.get(n.strategy)
        if writer is not None:
            # Another kind of topic send (a workflow's runs): its rows and the checkpoint in one transaction.
            written = writer(n, [(row[1], row[2]) for row in page], now)
            moved = _checkpoint(n, lane, len(page), page[-1][0], cursor_before)
            return PageResult(
                subscribers=len(page), inserted=written, published=written, stopped="" if moved else "superseded"
            )
        recipients = [_Row(row[1:]) for row in page]
        devices: dict[int, list[str]] = defaultdict(list)
        if "push" in n.channels:
            devices.update(device_tokens([r.pk for r in recipients]))
        targets = page_targets(n, recipients, devices)
        dead = suppressed_addresses(
            list({(channel, address) for _, channel, address in targets if address}), environment_id=n.environment_id
        )
        rows = page_plan(n, targets, now, dead=dead, fallback_zone=fallback_zone)
        bodies: list[dict[str, Any]] = []
        version_id = None
        if direct is not None:
            locales = {r.pk: r.locale for r in recipients}
            rows, bodies, version_id = direct.store_rows(n, rows, [locales[row[0]] for row in rows])
            if bodies:
                # Items shown on screen at commit must outlive a database crash: this commit waits for its flush.
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL synchronous_commit = on")
        if bodies and direct is not None:
            inserted = page_deliveries_insert(n, rows, at=now, stored=(bodies, version_id, direct.SENT_DETAIL))
        else:
            inserted = page_deliveries_insert(n, rows, at=now)
        # Deliveries suppressed or stored (in-app) at fan-out are status changes too: events for the calling
        # service and the inbox streams' NOTIFY, in bulk, committed with the page.
        reach_record([(row[0], row[2], "") for row in inserted if row[2] in (S.SUPPRESSED, S.SENT)], at=now)
        # A subscriber's chain that starts past its first channel says why, as the same recipient's single does.
        fallback.record_start_events(n, inserted, now)
    fallback.after_fanout_page(n, inserted, now)  # after commit: the timer for the pending steps
    stored = [row[0] for row in inserted if row[2] == S.SENT]
    if direct is not None:
        if later is None:
            direct.after_commit(n, len(stored), now, stored)
        elif stored:
            later.append(functools.partial(direct.after_commit, n, len(stored), now, stored))
    queued = [(row[0], row[1]) for row in inserted if row[2] == S.QUEUED]
    if len(inserted) < len(targets):
        # Part of this page was written by an earlier run that did not reach its checkpoint: publish again
        # every delivery of the page still waiting, whoever inserted it.
        queued = page_deliveries_waiting(n, [r.pk for r in recipients])
    published, come_back = _publish_page(queued, priority=n.priority, rate=rate)
    if published < len(queued):
        raise PublishIncomplete(f"{len(queued) - published} of {len(queued)} deliveries not published")
    for _, channel in queued:
        fed[channel] += 1
    moved = _checkpoint(n, lane, len(page), page[-1][0], cursor_before)
    result = PageResult(subscribers=len(page), inserted=len(inserted), published=published, pace_seconds=come_back)
    if not moved:
        # Another run advanced this lane meanwhile: let that run carry on.
        result.stopped = "superseded"
    return result


def page_targets(
    n: Notification, recipients: Sequence[_Row], devices: dict[int, list[str]]
) -> list[tuple[_Row, str, str]]:
    """Return a page's (recipient, channel, address) targets: one per address of each subscriber on each channel.

    `devices` holds the subscribers' active push tokens; an address-less target ("") is kept, to be suppressed
    with reason no_address.
    """
    webhook_default = n.client.webhook_url
    return [
        (r, channel, address)
        for r in recipients
        for channel in n.channels
        for address in channel_addresses(r, channel, webhook_default=webhook_default, tokens=devices.get(r.pk, []))
    ]


def page_plan(
    n: Notification,
    targets: Sequence[tuple[_Row, str, str]],
    now: datetime,
    *,
    dead: set[tuple[str, str]],
    fallback_zone: str,
) -> list[tuple[Any, ...]]:
    """Decide the first status of each target of a page; return the rows to insert, in the targets' order.

    Each row is (recipient id, channel, address, status, reason, not_before), planned as accept plans a single
    (notifier/deliveries/planning.py) with the send time in the subscriber's zone (`fallback_zone` for one without
    a zone), then a fallback chain's later steps held per subscriber. `dead` holds the targets on the suppression
    list. No query.
    """
    rows: list[tuple[Any, ...]] = []
    for r, channel, address in targets:
        # send_at_local: that wall-clock time in this subscriber's time zone (notifier/dispatch/localtime.py).
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
    # Smarter delivery hook (notifier/fallback.py): a fallback chain's later steps wait as pending.
    return fallback.plan_fanout_rows(n, rows, now)


@dataclass
class _Gate:
    """The grants of a page's throttled queues (notifier/dispatch/shares.py), settled once the page is published."""

    queues: dict[str, tuple[str, float, int]]  # channel -> (queue, provider rate, granted)
    project: int
    weight: int
    flow: str
    size: int = 0
    hold: shares.Share | None = None
    contended: bool = False

    def settle(self, fed: dict[str, int]) -> None:
        """Give back what the page did not feed (or add what it fed beyond its grant: a second push device)."""
        for channel, (queue, rate, granted) in self.queues.items():
            delta = fed.get(channel, 0) - granted
            shares.settle(queue, rate=rate, project=self.project, weight=self.weight, flow=self.flow, delta=delta)


# Subscribers of a topic at the start of its fan-out, per notification (the backlog shown on /metrics), kept for
# the few broadcasts a process works on.
_topic_sizes: dict[str, int] = {}


def _gate_open(n: Notification, channels: list[str], size: int) -> _Gate | None:
    """Ask each throttled queue of the page for room; return the grants (None: no throttled queue).

    The page then takes as many subscribers as the smallest grant; a queue without room or turn holds the page
    (`hold`) and the grants already taken are given back. A rate-capped campaign's page is counted in full,
    though its messages are spread over the page's seconds: the level errs on the side of a shorter queue.
    """
    throttled = {c: r for c in channels if (r := shares.channel_rate(c))}
    if not throttled:
        return None
    project, weight = environment_project_weight(n.environment_id)
    flow = str(n.pk)
    if flow not in _topic_sizes:
        if len(_topic_sizes) > 64:
            _topic_sizes.clear()
        _topic_sizes[flow] = subscriber_count(n.topic_id)
    backlog = max(0, _topic_sizes[flow] - (n.fanout_processed or 0))
    gate = _Gate(queues={}, project=project, weight=weight, flow=flow)
    for channel, provider_rate in throttled.items():
        queue = queue_name(channel, n.priority)
        share = shares.ask(
            queue, rate=provider_rate, project=project, weight=weight, flow=flow, want=size, backlog=backlog
        )
        if not share.granted:
            gate.settle({})
            gate.hold = share
            return gate
        gate.queues[channel] = (queue, provider_rate, share.granted)
        gate.contended = gate.contended or share.contended
        size = min(size, share.granted)
    gate.size = size
    return gate


def _gate_leave(n: Notification) -> None:
    """Take a finished broadcast out of its throttled queues' turns."""
    if n.priority == "high":
        return
    project, _ = environment_project_weight(n.environment_id)
    for channel in n.channels:
        if shares.channel_rate(channel):
            shares.leave(queue_name(channel, n.priority), project=project, flow=str(n.pk))
    _topic_sizes.pop(str(n.pk), None)


def _checkpoint(n: Notification, lane: int, count: int, last_id: int, cursor_before: int) -> bool:
    """Move a lane's checkpoint past a page (compare-and-set on the old cursor); return whether it moved."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE notifier_fanoutlane SET cursor = %s, processed = processed + %s, updated_at = now() "
            "WHERE notification_id = %s AND lane = %s AND cursor = %s AND NOT done",
            [last_id, count, n.pk, lane, cursor_before],
        )
        moved = cursor.rowcount
        if moved:
            notification_count_fanned_out(n.pk, count)
    return bool(moved)


def _publish_page(queued: list[tuple[int, str]], *, priority: str, rate: int | None) -> tuple[int, float | None]:
    """Publish a page's queued deliveries; at a rate cap or a high queue's pace, spread them with countdowns.

    Returns (how many were published, when to come back for the next page in seconds, or None for at once).
    A campaign (rate cap) comes back when its page's last message is due; a paced page when its reservations
    reach less than a pace window ahead.
    """
    if not queued:
        return 0, None  # a page of in-app items stored at fan-out (or of suppressed ones): nothing to publish
    groups: dict[str, list[int]] = defaultdict(list)
    for delivery_id, channel in queued:
        groups[channel].append(delivery_id)
    paced = priority == "high" and any(pace.pace_for(channel) > 0 for channel in groups)
    if not rate and not paced:
        return len(publish({queue_name(channel, priority): ids for channel, ids in groups.items()})), None
    # At most one second's worth of sends per message, so the cap holds second by second, not just on average.
    chunk = max(1, min(settings.SEND_BATCH_SIZE, rate or settings.SEND_BATCH_SIZE))
    published, offset, last_due = 0, 0, 0.0
    for channel, ids in groups.items():
        queue = queue_name(channel, priority)
        for start in range(0, len(ids), chunk):
            part = ids[start : start + chunk]
            earliest = offset / rate if rate else 0.0
            offset += len(part)
            # The pace's seconds are shared by every fan-out; a campaign's part goes no earlier than its cap says.
            parts = pace.reserve(channel, len(part), earliest=earliest) if paced else [(earliest, len(part))]
            taken = 0
            for countdown, count in parts:
                published += len(publish({queue: part[taken : taken + count]}, countdown=countdown, batch_size=chunk))
                taken += count
                last_due = max(last_due, float(countdown))
    if rate:
        return published, max(offset / rate, last_due)
    ahead = last_due - pace_window_seconds()
    return published, ahead if ahead > 0 else None


def _finish(n: Notification, lane: int, cursor_before: int) -> PageResult:
    """Mark a lane done (every subscriber of its range seen); the last lane marks the fan-out done."""
    with transaction.atomic(), connection.cursor() as cursor:
        # Under the notification's row lock, so that of two lanes finishing at once exactly one sees the other
        # done and marks the notification.
        notification_lock(n.pk)
        cursor.execute(
            "UPDATE notifier_fanoutlane SET done = true, updated_at = now() "
            "WHERE notification_id = %s AND lane = %s AND cursor = %s AND NOT done",
            [n.pk, lane, cursor_before],
        )
        if not cursor.rowcount:
            return PageResult(stopped="superseded")
        cursor.execute(
            "SELECT NOT EXISTS (SELECT 1 FROM notifier_fanoutlane WHERE notification_id = %s AND NOT done)", [n.pk]
        )
        finished = cursor.fetchone()[0] and notification_fanout_done(n.pk)
    if not finished:
        return PageResult(stopped="lane done")
    _gate_leave(n)
    if n.campaign_id is not None:
        _campaign_gate().campaign_fanout_finished(campaign_id=n.campaign_id)
    return PageResult(done=True)


def fanout_sweep(*, limit: int = 100) -> int:
    """Re-enqueue fan-out lanes that made no progress for a while (a lost message, a broker outage).

    Returns how many runs were enqueued. A fan-out not yet split into lanes counts by its own `updated_at`.
    A duplicate run next to a live one is harmless (see the module doc); paused campaigns are left alone.
    """
    now = timezone.now()
    cutoff = now - timedelta(seconds=stall_seconds())
    live = Notification.objects.filter(status=Notification.Status.FANNING_OUT).exclude(send_at__gt=now)
    if _campaign_gates:
        live = live.exclude(campaign__status__in=_campaign_gate().HELD_STATUSES)
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


def fanout_lanes_forget_dropped(cursor: Any, dropped_table: str, low: Any, high: Any) -> int:
    """Delete the lanes of the notifications of a dropped day's table that its parent no longer holds."""
    cursor.execute(
        f'DELETE FROM notifier_fanoutlane f USING "{dropped_table}" n WHERE f.notification_id = n.id'  # noqa: S608 - our table
        " AND NOT EXISTS (SELECT 1 FROM notifier_notification k WHERE k.id = n.id"
        " AND k.created_at >= %s AND k.created_at < %s)",
        [low, high],
    )
    return int(cursor.rowcount)
