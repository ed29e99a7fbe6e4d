"""GET /inbox/v1/stream: Server-Sent Events of one user's inbox, served by an ASGI server (uvicorn).

One PostgreSQL LISTEN per process (channel `notifier_inbox`, fed by notifier.statusevents.record in the same statement
that records the status change, so a notification arrives only once it is committed) is fanned out in memory
to the open streams of each recipient: 10,000 streams cost one database connection for notifications and a
small pool for the reads, not a connection each.

Events: `message` (the new inbox item, as the inbox API renders it) and `unread` (`{"unread_count": n}`)
on every change; a comment line as heartbeat every INBOX_HEARTBEAT_SECONDS. Each event's `id:` is a cursor
(milliseconds of the server's clock when it was sent). A client reconnecting with `Last-Event-ID` first gets
every item stored since that cursor, less INBOX_RESUME_MARGIN_SECONDS for items committed out of order, so
nothing in between is lost; clients deduplicate by item id (the widget does).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

import psycopg
from django.conf import settings

from core.database_url import parse_database_url
from core.db import int_array
from core.errors import error_body, retry_after_seconds, throttled_body
from core.heap import freeze_loaded_heap
from notifier.deliveries.queries import INBOX_ITEMS_SQL, INBOX_SINCE_SQL, INBOX_UNREAD_SQL, INBOX_UNREADS_SQL
from notifier.inbox import stream_limits
from notifier.inbox.browser import token_from
from notifier.inbox.cors import allowed_origin
from notifier.inbox.rate_limit import inbox_rate_take
from notifier.inbox.selectors import INBOX_CHANNEL, INBOX_VISIBLE_STATUSES
from notifier.inbox.tokens import InboxPrincipal, inbox_token_verify
from notifier.inbox.unread import RECENT_SECONDS, UnreadCounts
from notifier.statusevents.record import INBOX_CHANNEL as NOTIFY_CHANNEL
from notifier.tracking.services import is_web_url

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_VISIBLE = list(INBOX_VISIBLE_STATUSES)
# The position of read_at in an item row without its id (INBOX_ITEMS_SQL, _item).
_READ_AT = 7
MAX_QUEUED = 1000
HEARTBEAT = b": heartbeat\n\n"
# Recipients read per query; a larger burst is read in several queries at once over the pool.
PUSH_BATCH = 1000
# The garbage collector's full passes, taken off the push path (Hub._collect_garbage): one goes once no change
# has come for GC_IDLE_SECONDS, at most every GC_IDLE_EVERY_SECONDS, and at the latest every
# GC_LATEST_SECONDS whatever the traffic (a process that is never idle still frees its cycles).
GC_IDLE_SECONDS = 1.0
GC_IDLE_EVERY_SECONDS = 30.0
GC_LATEST_SECONDS = 120.0
GC_TICK_SECONDS = 0.25
# A threshold the oldest generation's count never reaches: no full pass but the hub's own.
_GC_NEVER = 2**30


# libpq's options of DATABASES that bound a silent server (config/settings.py): the LISTEN connection waits for
# notifications with nothing to send, so without keepalives a vanished primary would leave it waiting forever.
_TIMEOUT_OPTIONS = ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
                    "tcp_user_timeout")  # fmt: skip


def _conninfo(*, listen: bool = False) -> str:
    """Return the libpq connection string of the stream's reads, or of its LISTEN connection (`listen`).

    LISTEN needs a session of its own on PostgreSQL: through a pooler in transaction mode it would be lost, so
    INBOX_LISTEN_DATABASE_URL (when set) points the LISTEN connection at PostgreSQL itself.
    """
    db = settings.DATABASES["default"]
    options = db.get("OPTIONS", {})
    if listen and settings.INBOX_LISTEN_DATABASE_URL:
        db = parse_database_url(settings.INBOX_LISTEN_DATABASE_URL)
    return psycopg.conninfo.make_conninfo(
        dbname=db["NAME"], user=db.get("USER") or None, password=db.get("PASSWORD") or None,
        host=db.get("HOST") or None, port=str(db.get("PORT") or "") or None, application_name="notifier-stream",
        # A multi-host DATABASE_URL: the primary, as Django's own connections (core/database_url.py).
        target_session_attrs=db.get("OPTIONS", {}).get("target_session_attrs") or options.get("target_session_attrs"),
        **{name: options[name] for name in _TIMEOUT_OPTIONS if name in options},
    )  # fmt: skip


@functools.lru_cache(maxsize=1024)
def _web_url(url: str) -> str:
    """Return `url` stripped if it is an http(s) URL, else "" (a topic's items share one: checked once)."""
    url = url.strip()
    return url if is_web_url(url) else ""


def _item(row: tuple[Any, ...]) -> dict[str, Any]:
    """Render a row like notifier.inbox.apis.InboxItemSerializer does."""
    return {
        "id": row[0],
        "notification_id": str(row[1]),
        "title": row[2] or "",
        "body": row[3] or "",
        "url": _web_url(row[4]) if row[4] else "",
        "category": row[5],
        "status": row[6],
        "created_at": row[7].isoformat().replace("+00:00", "Z"),
        "read_at": row[8].isoformat().replace("+00:00", "Z") if row[8] else None,
        "archived_at": row[9].isoformat().replace("+00:00", "Z") if row[9] else None,
    }


def _now_ms() -> int:
    return int(time.time() * 1000)


class Subscriber:
    """One open stream: the encoded events waiting for its connection, and the future its pump sleeps on."""

    __slots__ = ("closed", "last_write", "overflow", "pending", "recent", "recipient_id", "resync", "waiter")

    def __init__(self, recipient_id: int) -> None:
        self.recipient_id = recipient_id
        # A plain list and one future rather than an asyncio.Queue: a burst (a topic's message and the count that
        # goes with it) is one append and one wake-up of the pump, which writes everything pending in one send.
        self.pending: list[bytes] = []
        self.waiter: asyncio.Future[None] | None = None
        self.last_write = time.monotonic()
        # Why the pump was woken with nothing to write: the client left, or the LISTEN connection came back and
        # this stream must re-read what it may have missed.
        self.closed = False
        self.resync = False
        # A client that stops reading while events keep coming is cut off (it reconnects and resumes) rather
        # than buffered without bound in the server's memory.
        self.overflow = False
        # Item ids sent lately, so a replay racing a live notification does not send an item twice.
        self.recent: deque[int] = deque(maxlen=64)

    def put_message(self, item_id: int, encoded: bytes) -> None:
        """Queue a `message` event, unless this item was queued lately."""
        if item_id in self.recent:
            return
        self.recent.append(item_id)
        self.put(encoded)

    def put_changes(self, messages: Sequence[tuple[int, bytes]], unread: bytes) -> None:
        """Queue a burst's new items (id and encoded event) and the count after them, with one wake-up."""
        recent = self.recent
        for item_id, encoded in messages:
            if item_id not in recent:
                recent.append(item_id)
                self.pending.append(encoded)
        self.put(unread)

    def put(self, chunk: bytes) -> None:
        """Queue an encoded event (or heartbeat) and wake the pump."""
        if len(self.pending) >= MAX_QUEUED:
            self.overflow = True
        else:
            self.pending.append(chunk)
        self.wake()

    def wake(self) -> None:
        """Wake the pump (to write, or to notice `closed`, `resync` or `overflow`)."""
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def encode(event: str, data: Any, at_ms: int | None = None) -> bytes:
    """Return one SSE event with a resumable id (`at_ms`: the id of a batch of events encoded at once)."""
    cursor = _now_ms() if at_ms is None else at_ms
    return f"id: {cursor}\nevent: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def message_events(rest: tuple[Any, ...], at_ms: int) -> tuple[bytes, bytes]:
    """Return the two halves of the `message` events of items alike but for their id: before and after the id.

    `rest` is an item row without its id. Rendering and JSON-encoding each of a topic's 10,000 items was most of
    a burst's CPU; this renders them once, and an item's event is `head + b"%d" % id + tail`, byte for byte
    encode("message", _item((id, *rest)), at_ms).
    """
    # The item with id 0 starts `{"id":0`; what follows is the same for every id.
    text = json.dumps(_item((0, *rest)), separators=(",", ":"))
    head = b'id: %d\nevent: message\ndata: {"id":' % at_ms
    return head, text[len('{"id":0') :].encode() + b"\n\n"


class Pool:
    """A few async connections for the reads (an item and a count per change, a count per new stream)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
        self._opened = 0
        self._lock = asyncio.Lock()

    async def fetch(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        """Run a read; a connection found broken (its server went away, a failover) is replaced and the read retried.

        After a failover every idle connection points at the old primary: each is dropped as it fails, and a new
        one (to DATABASE_URL's read-write host) takes the read, which changes nothing and may run again.
        """
        for attempt in range(self.size + 1):
            conn = await self._acquire()
            try:
                async with conn.cursor() as cursor:
                    await cursor.execute(sql, params)
                    rows = await cursor.fetchall()
            except psycopg.Error:
                await conn.close()
                async with self._lock:
                    self._opened -= 1
                if conn.broken and attempt < self.size:
                    continue
                raise
            self._free.put_nowait(conn)
            return rows
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _acquire(self) -> psycopg.AsyncConnection[Any]:
        if self._free.empty():
            async with self._lock:
                if self._opened < self.size:
                    self._opened += 1
                    try:
                        return await psycopg.AsyncConnection.connect(_conninfo(), autocommit=True)
                    except Exception:
                        self._opened -= 1
                        raise
        return await self._free.get()


class Hub:
    """The process's LISTEN connection and the open streams it feeds, by recipient."""

    def __init__(self) -> None:
        self.subscribers: dict[int, set[Subscriber]] = defaultdict(set)
        self.pool = Pool(settings.INBOX_STREAM_DB_POOL)
        self._listener: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        # Changes not yet read, by recipient: the new items' delivery ids (empty: the count only), and the
        # recipients with a change other than a new item (their count is read again, notifier/inbox/unread.py).
        self._pending: dict[int, set[int]] = {}
        self._recount: set[int] = set()
        self.counts = UnreadCounts()
        self._flusher: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._collector: asyncio.Task[None] | None = None
        # When the last NOTIFY came: the garbage collector's full pass waits for a quiet moment.
        self.last_change = 0.0

    async def start(self) -> None:
        """Start listening (once per process) and wait until LISTEN is in place."""
        if self._listener is None:
            self._listener = asyncio.create_task(self._listen(), name="inbox-listen")
            self._ticker = asyncio.create_task(self._heartbeats(), name="inbox-heartbeats")
            self._collector = asyncio.create_task(self._collect_garbage(), name="inbox-gc")
        await asyncio.wait_for(self._ready.wait(), timeout=10)

    def busy(self) -> bool:
        """Return whether changes came within GC_IDLE_SECONDS or are still being pushed."""
        flushing = self._flusher is not None and not self._flusher.done()
        return flushing or time.monotonic() - self.last_change < GC_IDLE_SECONDS

    async def _collect_garbage(self) -> None:
        """Run the garbage collector's full passes in quiet moments rather than in the middle of a push.

        With 10,000 open streams the process holds close to a million objects, and a full pass over them stops
        the event loop for 0.3-0.5 s. Left to Python, one falls due every few bursts (a burst's objects outlive
        the young generations while it is being pushed), and whichever burst it lands in reaches every stream
        that much later. Here the young generations are collected as usual, the full pass only by this task:
        when no change came for GC_IDLE_SECONDS (at most every GC_IDLE_EVERY_SECONDS), else after
        GC_LATEST_SECONDS. What the process loaded before its first stream (Django, the app) is frozen out of
        the passes: it lives as long as the process.
        """
        freeze_loaded_heap()
        young, middle, oldest = gc.get_threshold()
        gc.set_threshold(young, middle, _GC_NEVER)
        last = time.monotonic()
        try:
            while True:
                await asyncio.sleep(GC_TICK_SECONDS)
                waited = time.monotonic() - last
                if waited >= GC_LATEST_SECONDS or (waited >= GC_IDLE_EVERY_SECONDS and not self.busy()):
                    gc.collect()
                    last = time.monotonic()
        finally:
            gc.set_threshold(young, middle, oldest)

    def add(self, sub: Subscriber) -> None:
        self.subscribers[sub.recipient_id].add(sub)

    def remove(self, sub: Subscriber) -> None:
        subs = self.subscribers.get(sub.recipient_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self.subscribers[sub.recipient_id]
                self.counts.forget(sub.recipient_id)

    async def unread(self, recipient_id: int) -> int:
        """Read a recipient's unread count from the database (and keep it for the bursts that follow)."""
        started = self.counts.begin()
        rows = await self.pool.fetch(INBOX_UNREAD_SQL, [RECENT_SECONDS, recipient_id, INBOX_CHANNEL, _VISIBLE])
        count, recent = rows[0]
        return self.counts.stored(recipient_id, count, recent or (), started)

    async def _unreads(self, recipient_ids: list[int]) -> dict[int, int]:
        """Read the unread counts of several recipients (as `unread`, in one query)."""
        started = self.counts.begin()
        params = [RECENT_SECONDS, int_array(recipient_ids), INBOX_CHANNEL, _VISIBLE]
        rows = await self.pool.fetch(INBOX_UNREADS_SQL, params)
        found = {int(r): (int(count), recent or ()) for r, count, recent in rows}
        return {
            r: self.counts.stored(r, *found.get(r, (0, ())), started) for r in recipient_ids if r in self.subscribers
        }

    async def since(self, recipient_id: int, after: datetime) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(INBOX_SINCE_SQL, [recipient_id, INBOX_CHANNEL, _VISIBLE, after])
        return [_item(r) for r in rows]

    async def _listen(self) -> None:
        delay = 0.5
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(_conninfo(listen=True), autocommit=True) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    if self._ready.is_set():
                        # Reconnected: notifications may have been missed meanwhile; let every stream catch up.
                        for subs in list(self.subscribers.values()):
                            for sub in list(subs):
                                sub.resync = True
                                sub.wake()
                    self._ready.set()
                    delay = 0.5
                    async for notify in conn.notifies():
                        self._dispatch(notify.payload)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("inbox LISTEN connection lost; reconnecting", exc_info=True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _heartbeats(self) -> None:
        """Once a second, queue a heartbeat for every stream idle for INBOX_HEARTBEAT_SECONDS.

        One task for all streams instead of a timeout per stream (a timer and a task each time in asyncio), and
        each stream's heartbeat falls due from its own last write, so they spread over the interval.
        """
        interval = settings.INBOX_HEARTBEAT_SECONDS
        tick = min(1.0, interval / 2)
        while True:
            await asyncio.sleep(tick)
            due = time.monotonic() - interval
            for subs in list(self.subscribers.values()):
                for sub in subs:
                    if sub.last_write <= due:
                        sub.last_write = time.monotonic()  # not twice while this one waits to be written
                        sub.put(HEARTBEAT)

    def _dispatch(self, payload: str) -> None:
        """Note the changes of one NOTIFY ("<recipient>:<delivery>" or "<recipient>:", comma-separated)."""
        self.last_change = time.monotonic()
        subscribers, pending = self.subscribers, self._pending
        for change in payload.split(","):
            recipient, _, delivery = change.partition(":")
            try:
                recipient_id = int(recipient)
                delivery_id = int(delivery) if delivery else None
            except ValueError:
                continue
            if recipient_id not in subscribers:
                continue  # nobody of this recipient is connected to this process
            ids = pending.get(recipient_id)
            if ids is None:
                ids = pending[recipient_id] = set()
            if delivery_id is not None:
                ids.add(delivery_id)
            else:
                self._recount.add(recipient_id)
        if not pending:
            return
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="inbox-flush")

    async def _flush(self) -> None:
        """Read and push every pending change, a batch of recipients per query, until none is left.

        A topic's in-app message arrives as thousands of changes within a second (NOTIFYs of up to
        notifier.statusevents.record.NOTIFY_BATCH each): read one at a time (an item and a count each) they would queue
        behind the pool for seconds. Whatever arrives while a batch
        is being read waits for the next one, so a burst costs a few queries and a lone change goes at once.
        """
        while self._pending:
            pending, self._pending = self._pending, {}
            recount, self._recount = self._recount, set()
            recipients = list(pending)
            chunks = [recipients[i : i + PUSH_BATCH] for i in range(0, len(recipients), PUSH_BATCH)]
            await asyncio.gather(*(self._push({r: pending[r] for r in chunk}, recount) for chunk in chunks))

    async def _push(self, pending: dict[int, set[int]], recount: set[int]) -> None:
        # Counts are read only where a new item cannot simply be added: a change other than a new item, or a
        # recipient whose count this process does not know yet (notifier/inbox/unread.py).
        counts = self.counts
        to_read = [r for r in pending if r in recount or not counts.known(r)]
        try:
            delivery_ids = [d for ids in pending.values() for d in ids]
            rows = (
                await self.pool.fetch(
                    INBOX_ITEMS_SQL,
                    # Arrays as literals built in C: psycopg would dump a list element by element in Python.
                    [int_array(delivery_ids), min(delivery_ids), max(delivery_ids), INBOX_CHANNEL, _VISIBLE],
                )
                if delivery_ids
                else []
            )
            read = await self._unreads(to_read) if to_read else {}
        except Exception:
            log.warning("could not read inbox changes for their streams", exc_info=True)
            for recipient_id in pending:
                # Whatever this burst would have added is unknown now: read those counts at the next change.
                counts.forget(recipient_id)
            return
        # Each event is encoded once, not once per stream, and a topic's items share the encoding of everything
        # but their id (message_events); a count is encoded once per value (most of a topic's recipients share
        # one); all with the batch's cursor. A recipient's items are tuples, not lists: tuples of integers and
        # bytes drop out of the garbage collector's sight at its first pass.
        at_ms = _now_ms()
        items: dict[int, tuple[tuple[int, bytes], ...]] = {}
        unread_items: dict[int, list[int]] = defaultdict(list)
        several = False
        for *rest, ids, recipients in rows:
            head, tail = message_events(tuple(rest), at_ms)
            is_unread = rest[_READ_AT] is None
            for delivery_id, recipient_id in zip(ids, recipients, strict=True):
                if recipient_id in pending:  # the item's own recipient, nobody else's streams
                    if is_unread:
                        unread_items[recipient_id].append(delivery_id)
                    event = (delivery_id, b"%s%d%s" % (head, delivery_id, tail))
                    found = items.get(recipient_id)
                    if found is None:
                        items[recipient_id] = (event,)
                    else:
                        items[recipient_id] = (*found, event)
                        several = True
        if several:
            # Items of one recipient from different rows: in the order they were stored, as one row would be.
            items = {r: tuple(sorted(events)) for r, events in items.items()}
        unread: dict[int, bytes] = {}
        no_items: tuple[tuple[int, bytes], ...] = ()
        for recipient_id in pending:
            subs = self.subscribers.get(recipient_id)
            if not subs:
                continue
            count = read.get(recipient_id)
            if count is None:
                count = counts.added(recipient_id, unread_items.get(recipient_id, ()))
            if count is None:  # its count was forgotten meanwhile (a failed read): read it at once
                count = await self.unread(recipient_id)
            encoded = unread.get(count)
            if encoded is None:
                encoded = unread[count] = encode("unread", {"unread_count": count}, at_ms)
            messages = items.get(recipient_id, no_items)
            for sub in list(subs):
                sub.put_changes(messages, encoded)


_hub: Hub | None = None


def hub() -> Hub:
    """Return this process's hub (created on the first stream, inside the server's event loop)."""
    global _hub
    if _hub is None:
        _hub = Hub()
    return _hub


async def _respond(send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
    raw = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                *headers,
                (b"content-type", b"application/json"),
                (b"content-length", str(len(raw)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": raw})


class BadCursor(ValueError):
    """A Last-Event-ID that is not one of this stream's cursors (answered 400 before the stream starts)."""


# Cursors are milliseconds of the server's clock (13 digits until the year 2286): anything longer is refused
# unread, so a huge header costs no conversion.
MAX_CURSOR_DIGITS = 15


def _parse_cursor(value: str) -> datetime | None:
    """Return the resume point of a Last-Event-ID (None when there is none); raise BadCursor if malformed."""
    value = value.strip()
    if not value:
        return None
    if len(value) > MAX_CURSOR_DIGITS or not value.isascii() or not value.isdigit():
        raise BadCursor(f"must be a number of at most {MAX_CURSOR_DIGITS} digits (an event id of this stream)")
    seconds = int(value) / 1000
    if seconds > time.time() + 86400:
        raise BadCursor("lies in the future (not an event id of this stream)")
    return datetime.fromtimestamp(max(seconds - settings.INBOX_RESUME_MARGIN_SECONDS, 0), tz=UTC)


async def stream_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Serve one SSE stream of the token user's inbox until the client goes away."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1")).items()}
    cors: list[tuple[bytes, bytes]] = []
    origin = allowed_origin(headers.get("origin", ""))
    if origin:
        cors = [(b"access-control-allow-origin", origin.encode()), (b"vary", b"Origin")]
    if scope["method"] == "OPTIONS":
        await _respond(send, 204, {}, [*cors, (b"access-control-allow-headers", b"Authorization, Last-Event-ID")])
        return
    if scope["method"] != "GET":
        await _respond(send, 405, error_body("method_not_allowed", "GET only."), cors)
        return
    token = token_from(headers.get("authorization", ""), query.get("token", ""))
    principal: InboxPrincipal | None = inbox_token_verify(token)
    if principal is None:
        await _respond(send, 401, error_body("unauthenticated", "Invalid or expired inbox token."), cors)
        return
    # Every attempt counts against the token's rate, as a request to /inbox/v1/ does; the limiter is
    # synchronous (one Redis call), so it runs off the event loop.
    grant = await asyncio.to_thread(inbox_rate_take, recipient_id=principal.recipient_id)
    if grant.granted < 1:
        retry = str(retry_after_seconds(grant.wait)).encode()
        await _respond(send, 429, throttled_body(grant.wait), [*cors, (b"retry-after", retry)])
        return
    try:
        resume = _parse_cursor(headers.get("last-event-id") or query.get("last_event_id", ""))
    except BadCursor as exc:
        body = error_body("invalid_last_event_id", f"Last-Event-ID {exc}.", {"Last-Event-ID": [str(exc)]})
        await _respond(send, 400, body, cors)
        return
    limits = stream_limits.leases()
    lease, verdict = await limits.acquire(token=token, recipient_id=principal.recipient_id)
    if lease is None:
        if verdict == stream_limits.TOKEN_FULL:
            field, reason = "token", f"at most {settings.INBOX_STREAM_MAX_PER_TOKEN} open streams per inbox token"
        else:
            field, reason = "recipient", f"at most {settings.INBOX_STREAM_MAX_PER_RECIPIENT} open streams per recipient"
        body = error_body("too_many_streams", f"Too many open streams: {reason}; close one first.", {field: [reason]})
        retry = str(int(settings.INBOX_STREAM_LEASE_SECONDS)).encode()
        await _respond(send, 429, body, [*cors, (b"retry-after", retry)])
        return
    try:
        await _serve(receive, send, principal, resume, cors)
    finally:
        await limits.release(lease)


async def _serve(
    receive: Receive,
    send: Send,
    principal: InboxPrincipal,
    resume: datetime | None,
    cors: list[tuple[bytes, bytes]],
) -> None:
    """Stream events to one admitted caller until it goes away."""
    h = hub()
    await h.start()
    sub = Subscriber(principal.recipient_id)
    # Subscribe before reading, so a change committed meanwhile is either read or notified (or both: deduplicated).
    h.add(sub)
    try:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    *cors,
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        # The client's reconnect delay, then the catch-up: items since the client's last event, and the count.
        await send({"type": "http.response.body", "body": b"retry: 2000\n\n", "more_body": True})
        await _catch_up(h, sub, resume)
        await _pump(h, sub, resume, receive, send, expires=principal.expires)
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        h.remove(sub)


async def _catch_up(h: Hub, sub: Subscriber, since: datetime | None) -> None:
    if since is not None:
        for item in await h.since(sub.recipient_id, since):
            sub.put_message(item["id"], encode("message", item))
    sub.put(encode("unread", {"unread_count": await h.unread(sub.recipient_id)}))


async def _pump(
    h: Hub, sub: Subscriber, resume: datetime | None, receive: Receive, send: Send, *, expires: float
) -> None:
    """Write queued events and heartbeats until the client disconnects, falls too far behind, or its token expires.

    An expired token ends the stream (checked at least every heartbeat): the browser's reconnect is then refused
    and the page must hand the widget a fresh token.
    """

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        sub.closed = True
        sub.wake()

    loop = asyncio.get_running_loop()
    watcher = asyncio.create_task(watch())
    try:
        while True:
            if not sub.pending:
                sub.waiter = loop.create_future()
                try:
                    await sub.waiter
                finally:
                    sub.waiter = None
            if sub.closed or sub.overflow or time.time() >= expires:
                return
            if sub.resync:
                # The LISTEN connection came back: anything stored while it was down is read again.
                sub.resync = False
                since = datetime.fromtimestamp(time.time() - 60 - settings.INBOX_RESUME_MARGIN_SECONDS, tz=UTC)
                try:
                    await _catch_up(h, sub, since if resume is None else min(since, resume))
                except psycopg.Error:
                    # The database is not back for reads yet: end the stream; the client reconnects with its
                    # Last-Event-ID and catches up then (an error here would cut it off without an end).
                    log.warning("inbox stream catch-up failed; ending the stream for the client to resume")
                    return
            # Everything queued since the last write goes in one write.
            chunk = b"".join(sub.pending)
            sub.pending.clear()
            if not chunk:
                continue
            try:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except OSError:
                return
            sub.last_write = time.monotonic()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
