"""GET /inbox/v1/stream: Server-Sent Events of one user's inbox, served by an ASGI server (uvicorn).

One PostgreSQL LISTEN per process (channel `notifier_inbox`, fed by notifier.reach in the same statement
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
import json
import logging
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

import psycopg
from django.conf import settings

from notifier.inbox.browser import token_from
from notifier.inbox.cors import allowed_origin
from notifier.inbox.selectors import INBOX_CHANNEL, INBOX_VISIBLE_STATUSES
from notifier.inbox.tokens import InboxPrincipal, inbox_token_verify
from notifier.reach import INBOX_CHANNEL as NOTIFY_CHANNEL

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_VISIBLE = list(INBOX_VISIBLE_STATUSES)
MAX_QUEUED = 1000
HEARTBEAT = b": heartbeat\n\n"
_ITEM_COLUMNS = "d.id, d.notification_id, d.content, n.category, d.status, d.created_at, d.read_at"
_ITEM_SQL = (
    f"SELECT {_ITEM_COLUMNS} FROM notifier_delivery d JOIN notifier_notification n ON n.id = d.notification_id"  # noqa: S608
    " WHERE d.id = %s AND d.recipient_id = %s AND d.channel = %s AND d.status = ANY(%s)"
)
_SINCE_SQL = (
    f"SELECT {_ITEM_COLUMNS} FROM notifier_delivery d JOIN notifier_notification n ON n.id = d.notification_id"  # noqa: S608
    " WHERE d.recipient_id = %s AND d.channel = %s AND d.status = ANY(%s) AND d.sent_at > %s"
    " ORDER BY d.sent_at, d.id LIMIT 500"
)
_UNREAD_SQL = (
    "SELECT count(*) FROM notifier_delivery WHERE recipient_id = %s AND channel = %s AND status = ANY(%s)"
    " AND read_at IS NULL"
)


def _conninfo() -> str:
    db = settings.DATABASES["default"]
    return psycopg.conninfo.make_conninfo(
        dbname=db["NAME"], user=db.get("USER") or None, password=db.get("PASSWORD") or None,
        host=db.get("HOST") or None, port=str(db.get("PORT") or "") or None, application_name="notifier-stream",
    )  # fmt: skip


def _item(row: tuple[Any, ...]) -> dict[str, Any]:
    """Render a row like notifier.inbox.apis.InboxItemSerializer does."""
    content = row[2] or {}
    return {
        "id": row[0],
        "notification_id": str(row[1]),
        "title": str(content.get("title", "")),
        "body": str(content.get("body", "")),
        "category": row[3],
        "status": row[4],
        "created_at": row[5].isoformat().replace("+00:00", "Z"),
        "read_at": row[6].isoformat().replace("+00:00", "Z") if row[6] else None,
    }


def _now_ms() -> int:
    return int(time.time() * 1000)


class Subscriber:
    """One open stream: a queue of encoded events for its connection."""

    __slots__ = ("closed", "last_write", "overflow", "queue", "recent", "recipient_id", "resync")

    def __init__(self, recipient_id: int) -> None:
        self.recipient_id = recipient_id
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.last_write = time.monotonic()
        # Why the pump was woken with an empty entry: the client left, or the LISTEN connection came back and
        # this stream must re-read what it may have missed.
        self.closed = False
        self.resync = False
        # A client that stops reading while events keep coming is cut off (it reconnects and resumes) rather
        # than buffered without bound in the server's memory.
        self.overflow = False
        # Item ids sent lately, so a replay racing a live notification does not send an item twice.
        self.recent: deque[int] = deque(maxlen=64)

    def put_message(self, item: dict[str, Any]) -> None:
        if item["id"] in self.recent:
            return
        self.recent.append(item["id"])
        self._put(encode("message", item))

    def put_unread(self, count: int) -> None:
        self._put(encode("unread", {"unread_count": count}))

    def _put(self, chunk: bytes) -> None:
        if self.queue.qsize() >= MAX_QUEUED:
            self.overflow = True
            self.queue.put_nowait(b"")  # wake the pump so it closes the stream
            return
        self.queue.put_nowait(chunk)


def encode(event: str, data: Any) -> bytes:
    """Return one SSE event with a resumable id."""
    return f"id: {_now_ms()}\nevent: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class Pool:
    """A few async connections for the reads (an item and a count per change, a count per new stream)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
        self._opened = 0
        self._lock = asyncio.Lock()

    async def fetch(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        conn = await self._acquire()
        try:
            async with conn.cursor() as cursor:
                await cursor.execute(sql, params)
                rows = await cursor.fetchall()
        except psycopg.Error:
            await conn.close()
            async with self._lock:
                self._opened -= 1
            raise
        self._free.put_nowait(conn)
        return rows

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
        self._pushes: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start listening (once per process) and wait until LISTEN is in place."""
        if self._listener is None:
            self._listener = asyncio.create_task(self._listen(), name="inbox-listen")
            self._ticker = asyncio.create_task(self._heartbeats(), name="inbox-heartbeats")
        await asyncio.wait_for(self._ready.wait(), timeout=10)

    def add(self, sub: Subscriber) -> None:
        self.subscribers[sub.recipient_id].add(sub)

    def remove(self, sub: Subscriber) -> None:
        subs = self.subscribers.get(sub.recipient_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self.subscribers[sub.recipient_id]

    async def unread(self, recipient_id: int) -> int:
        rows = await self.pool.fetch(_UNREAD_SQL, [recipient_id, INBOX_CHANNEL, _VISIBLE])
        return int(rows[0][0])

    async def since(self, recipient_id: int, after: datetime) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(_SINCE_SQL, [recipient_id, INBOX_CHANNEL, _VISIBLE, after])
        return [_item(r) for r in rows]

    async def _listen(self) -> None:
        delay = 0.5
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(_conninfo(), autocommit=True) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    if self._ready.is_set():
                        # Reconnected: notifications may have been missed meanwhile; let every stream catch up.
                        for subs in list(self.subscribers.values()):
                            for sub in list(subs):
                                sub.resync = True
                                sub.queue.put_nowait(b"")
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
                        sub.queue.put_nowait(HEARTBEAT)

    def _dispatch(self, payload: str) -> None:
        recipient, _, delivery = payload.partition(":")
        try:
            recipient_id = int(recipient)
        except ValueError:
            return
        if recipient_id not in self.subscribers:
            return  # nobody of this recipient is connected to this process
        task = asyncio.create_task(self._push(recipient_id, int(delivery) if delivery else None))
        # Keep a reference until done: the loop holds tasks only weakly.
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)

    async def _push(self, recipient_id: int, delivery_id: int | None) -> None:
        try:
            item = None
            if delivery_id is not None:
                rows = await self.pool.fetch(_ITEM_SQL, [delivery_id, recipient_id, INBOX_CHANNEL, _VISIBLE])
                item = _item(rows[0]) if rows else None
            count = await self.unread(recipient_id)
        except Exception:
            log.warning("could not read an inbox change for its streams", exc_info=True)
            return
        for sub in list(self.subscribers.get(recipient_id, ())):
            if item is not None:
                sub.put_message(item)
            sub.put_unread(count)


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
        {"type": "http.response.start", "status": status, "headers": [*headers, (b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": raw})


def _parse_cursor(value: str) -> datetime | None:
    try:
        ms = int(value)
    except ValueError:
        return None
    return datetime.fromtimestamp(ms / 1000 - settings.INBOX_RESUME_MARGIN_SECONDS, tz=UTC)


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
        await _respond(send, 405, {"error": {"code": "method_not_allowed", "message": "GET only."}}, cors)
        return
    principal: InboxPrincipal | None = inbox_token_verify(
        token_from(headers.get("authorization", ""), query.get("token", ""))
    )
    if principal is None:
        body = {"error": {"code": "unauthenticated", "message": "Invalid or expired inbox token."}}
        await _respond(send, 401, body, cors)
        return
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
        resume = _parse_cursor(headers.get("last-event-id") or query.get("last_event_id", ""))
        await _catch_up(h, sub, resume)
        await _pump(h, sub, resume, receive, send, expires=principal.expires)
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        h.remove(sub)


async def _catch_up(h: Hub, sub: Subscriber, since: datetime | None) -> None:
    if since is not None:
        for item in await h.since(sub.recipient_id, since):
            sub.put_message(item)
    sub.put_unread(await h.unread(sub.recipient_id))


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
        sub.queue.put_nowait(b"")

    watcher = asyncio.create_task(watch())
    try:
        while True:
            chunk = await sub.queue.get()
            if sub.closed or sub.overflow or time.time() >= expires:
                return
            if sub.resync:
                # The LISTEN connection came back: anything stored while it was down is read again.
                sub.resync = False
                since = datetime.fromtimestamp(time.time() - 60 - settings.INBOX_RESUME_MARGIN_SECONDS, tz=UTC)
                await _catch_up(h, sub, since if resume is None else min(since, resume))
            # Coalesce whatever else is queued into the same write.
            while not sub.queue.empty():
                chunk += sub.queue.get_nowait()
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
