"""Open inbox streams held by one stream server, and how fast a new message reaches them.

    BENCH_NS=me .venv/bin/python bench/inbox_streams.py [--streams 10000] [--messages 300] [--rate 20]
    BENCH_NS=me .venv/bin/python bench/inbox_streams.py --topic [--streams 1000] [--rounds 5]

Starts the stream server (uvicorn, config.asgi, one process), an in-app worker and the HTTP API (gunicorn) on
the bench database; creates N recipients and opens one SSE stream for each from this process (asyncio raw
sockets, RLIMIT_NOFILE raised); then POSTs M in-app notifications over the API at R per second to random
connected users and measures, per message, the time from just before the POST to the `message` event read
off that user's stream (send -> on screen, less the browser's rendering). Prints open streams, percentiles,
lost messages, and the stream server's memory and CPU. The machine is shared with everything else it runs.

`--topic` subscribes every one of the N users to one topic and, per round, POSTs one in-app notification to that
topic over the API (accept, fan-out worker, broker, in-app worker, NOTIFY, stream server), then times, from just
before the POST, the `message` event on every one of the N streams: p50/p99/max over all streams and rounds,
per round, and how many streams never got it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import resource
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ENV,
    ROOT,
    ApiServer,
    Worker,
    cleanup,
    group_cpu,
    log,
    mean,
    parser,
    percentile,
    prepare,
    print_cpu,
    stop_process_group,
    wait_until,
    workers,
)


class StreamServer:
    """uvicorn serving config.asgi on the bench database."""

    def __init__(self, port: int, processes: int = 1) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.log_path = ROOT / "var" / f"bench-stream-{os.getpid()}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port),
             "--no-access-log", "--backlog", "4096", "--log-level", "warning", "--workers", str(processes)],
            cwd=ROOT, env={**os.environ, **ENV}, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

        def up() -> bool:
            try:
                return urllib.request.urlopen(f"{self.url}/healthz", timeout=1).status == 200
            except OSError:
                return False

        wait_until(up, timeout=60, what="the stream server")

    def usage(self) -> tuple[float, float]:
        """Return (RSS in MB, CPU seconds) of the server's processes (with --stream-workers, its children too)."""
        import psutil

        root = psutil.Process(self.proc.pid)
        processes = [root, *root.children(recursive=True)]
        return (
            sum(p.memory_info().rss for p in processes) / 2**20,
            sum(sum(p.cpu_times()[:2]) for p in processes),
        )

    def stop(self) -> None:
        stop_process_group(self.proc)
        self._log.close()


class Stream(asyncio.Protocol):
    """One open SSE connection; records when each marked message arrived.

    A protocol, not a reader task: this one process stands in for 10,000 browsers on the same two cores as the
    server it measures, so each event costs it one `data_received` call (no future, no task switch), and the
    arrival is stamped before anything is parsed.
    """

    def __init__(self, user: str, token: str) -> None:
        self.user = user
        self.token = token
        self.ready = asyncio.Event()
        self.closed = asyncio.Event()
        self.heartbeats = 0
        # Title -> when it arrived on this stream (--topic: every stream gets every round's message).
        self.arrivals: dict[str, float] = {}
        self._shared: dict[str, float] = {}
        self._buffer = b""

    async def run(self, port: int, arrivals: dict[str, float]) -> None:
        self._shared = arrivals
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_connection(lambda: self, "127.0.0.1", port)
        transport.write(
            f"GET /inbox/v1/stream?token={self.token} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        try:
            await self.closed.wait()
        finally:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()

    def data_received(self, chunk: bytes) -> None:
        now = time.monotonic()
        buffer = self._buffer + chunk if self._buffer else chunk
        end = buffer.rfind(b"\n\n")
        if end < 0:
            self._buffer = buffer
            return
        self._buffer = buffer[end + 2 :]
        for block in buffer[:end].split(b"\n\n"):
            if b"event: message" in block:
                # The title is a plain string the bench chose ("topic-3", "m-17"): cut out, not parsed as JSON.
                start = block.index(b'"title":"') + 9
                title = block[start : block.index(b'"', start)].decode()
                self._shared.setdefault(title, now)
                self.arrivals.setdefault(title, now)
            elif b"event: unread" in block:
                self.ready.set()
            elif b": heartbeat" in block:
                self.heartbeats += 1


async def open_streams(streams: list[Stream], port: int, arrivals: dict[str, float], step: int) -> list[asyncio.Task]:
    tasks = []
    for i in range(0, len(streams), step):
        batch = streams[i : i + step]
        tasks += [asyncio.create_task(s.run(port, arrivals)) for s in batch]
        await asyncio.wait([asyncio.create_task(s.ready.wait()) for s in batch], timeout=60)
        if (i // step) % 4 == 3 or i + step >= len(streams):
            log(f"  {sum(s.ready.is_set() for s in streams[: i + step])} streams open")
    return tasks


async def measure(
    args: Any, streams: list[Stream], stream_port: int, api_url: str, key: str, client_id: int
) -> dict[str, object]:
    arrivals: dict[str, float] = {}
    opened_at = time.monotonic()
    tasks = await open_streams(streams, stream_port, arrivals, args.step)
    open_seconds = time.monotonic() - opened_at
    ready = [s for s in streams if s.ready.is_set()]
    # This process stands in for 10,000 browsers: keep its own garbage collector (10,000 streams' objects)
    # out of the latencies it measures.
    gc.collect()
    gc.freeze()
    gc.disable()
    log(f"{len(ready)} of {len(streams)} streams open in {open_seconds:.1f} s; sending {args.messages} messages")
    sent_at: dict[str, float] = {}
    pool = ThreadPoolExecutor(max_workers=8)
    loop = asyncio.get_running_loop()

    def deliver_directly(title: str, user: str) -> None:
        # --direct: the worker's pipeline (claim, render, in-app store, outcome with its NOTIFY) run here, without
        # the HTTP API and the broker in front of it.
        from channels_app.services import deliver
        from notifier.deliveries.models import Delivery, Notification
        from preferences.models import Recipient

        recipient = Recipient.objects.get(user_id=user)
        sent_at[title] = time.monotonic()
        n = Notification.objects.create(
            client_id=client_id, category="transactional", template_key="live", template_version=1,
            channels=["inapp"], payload={"t": title}, recipient=recipient, user_id=user, priority="high",
        )  # fmt: skip
        d = Delivery.objects.create(
            notification=n, recipient=recipient, channel="inapp", priority="high", address=user, status="queued"
        )
        deliver([d.pk])

    def post(title: str, user: str) -> None:
        if args.direct:
            deliver_directly(title, user)
            return
        body = {"recipient": {"user_id": user}, "category": "transactional", "template": "live", "channels": ["inapp"]}
        body["payload"] = {"t": title}
        request = urllib.request.Request(
            f"{api_url}/api/v1/notifications",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        sent_at[title] = time.monotonic()
        urllib.request.urlopen(request, timeout=30).read()

    futures = []
    for k in range(args.messages):
        user = random.choice(ready).user
        futures.append(loop.run_in_executor(pool, post, f"m-{k}", user))
        await asyncio.sleep(1 / args.rate)
    await asyncio.gather(*futures)
    deadline = time.monotonic() + 15
    while len(arrivals) < args.messages and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    latencies = [(arrivals[t] - sent_at[t]) * 1000 for t in sent_at if t in arrivals]
    if args.hold:
        # Keep the streams open past a heartbeat or two: idle streams must stay up.
        log(f"holding {len(ready)} streams for {args.hold:.0f} s")
        await asyncio.sleep(args.hold)
    still_open = sum(1 for t in tasks if not t.done())
    heartbeats = sum(1 for s in ready if s.heartbeats)
    for t in tasks:
        t.cancel()
    return {
        "opened": len(ready),
        "open_seconds": open_seconds,
        "still_open": still_open,
        "with_heartbeat": heartbeats,
        "latencies": latencies,
        "lost": args.messages - len(latencies),
    }


def deliver_topic_directly(title: str, client_id: int, batch: int, threads: int) -> float:
    """--topic --direct: what fan-out and the in-app worker do, in this process: the page's deliveries in one insert,
    then the worker's pipeline on them `batch` at a time (the ids of one broker message), `threads` batches at once
    (the in-app worker's threads)."""
    from django.db import connection

    from channels_app.services import deliver
    from notifier.deliveries.models import Notification

    n = Notification.objects.create(
        client_id=client_id, category="transactional", template_key="live", template_version=1,
        channels=["inapp"], payload={"t": title}, priority="high", status="done",
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO notifier_delivery (id, notification_id, recipient_id, channel, priority, address, status,"
            " reason, provider, provider_message_id, attempts, last_error, created_at, updated_at)"
            " SELECT notifier_delivery_id(%s::timestamptz), %s, r.id, 'inapp', 'high', r.user_id, 'queued', '', '', '',"
            " 0, '', now(), now() FROM preferences_recipient r WHERE r.user_id LIKE 'live-%%' ORDER BY r.id"
            " RETURNING id",
            [n.created_at, n.pk],
        )
        ids = [row[0] for row in cursor.fetchall()]
    accepted = time.monotonic()

    def run(chunk: list[int]) -> None:
        from django.db import connection as own

        try:
            deliver(chunk)
        finally:
            own.close()

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(run, [ids[i : i + batch] for i in range(0, len(ids), batch)]))
    return accepted


def accept_and_fan_out(title: str, client_id: int) -> float:
    """--topic --in-process: the API's accept and the fan-out task's runs in this process (no HTTP, no broker).

    Returns when the accept committed. The fan-out task a real accept enqueues is run here instead, at once.
    """
    from django.db import connection

    from core.queues import mark_broker_down
    from notifier.accepting.services import notification_accept
    from notifier.clients.models import ApiClient
    from notifier.dispatch.fanout import fanout_run

    client = ApiClient.objects.get(pk=client_id)
    mark_broker_down()  # the accept's own enqueue of the fan-out task is skipped; it runs below
    data = {"topic": "live", "template": "live", "channels": ["inapp"], "payload": {"t": title}}
    notification = notification_accept(client=client, data=data).notification
    accepted = time.monotonic()
    try:
        while not fanout_run(notification_id=notification.pk, enqueue_next=False).done:
            pass
    finally:
        connection.close()
    return accepted


async def measure_topic(
    args: Any, streams: list[Stream], stream_port: int, api_url: str, key: str, client_id: int = 0
) -> dict[str, Any]:
    """Open every stream, then per round one in-app notification to the topic of them all; time each stream."""
    arrivals: dict[str, float] = {}
    opened_at = time.monotonic()
    tasks = await open_streams(streams, stream_port, arrivals, args.step)
    open_seconds = time.monotonic() - opened_at
    ready = [s for s in streams if s.ready.is_set()]
    gc.collect()
    gc.freeze()
    gc.disable()
    log(f"{len(ready)} of {len(streams)} streams open in {open_seconds:.1f} s; {args.rounds} topic sends")
    loop = asyncio.get_running_loop()
    rounds: list[dict[str, Any]] = []
    notified: list[float] = []
    listener = asyncio.create_task(_listen(notified))

    def post(title: str) -> float:
        if args.direct:
            return deliver_topic_directly(title, client_id, args.batch, args.threads)
        if args.in_process:
            return accept_and_fan_out(title, client_id)
        body = {"topic": "live", "template": "live", "channels": ["inapp"], "payload": {"t": title}}
        request = urllib.request.Request(
            f"{api_url}/api/v1/notifications",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=30).read()
        return time.monotonic()

    cpu_before = group_cpu()
    for k in range(args.rounds):
        title = f"topic-{k}"
        notified.clear()
        sent_at = time.monotonic()
        accepted_at = await loop.run_in_executor(None, post, title)
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline and sum(title in s.arrivals for s in ready) < len(ready):
            await asyncio.sleep(0.05)
        lat = [(s.arrivals[title] - sent_at) * 1000 for s in ready if title in s.arrivals]
        stages = await loop.run_in_executor(None, _stages, title, time.time() - (time.monotonic() - sent_at))
        if notified:
            stages["notify_first"], stages["notify_last"] = [(t - sent_at) * 1000 for t in (notified[0], notified[-1])]
        rounds.append(
            {"accept_ms": (accepted_at - sent_at) * 1000, "latencies": lat, "lost": len(ready) - len(lat), **stages}
        )
        log(
            f"  round {k + 1}: accept {(accepted_at - sent_at) * 1000:.0f} ms, p50 {percentile(lat, 50):.0f} "
            f"p99 {percentile(lat, 99):.0f} max {max(lat) if lat else float('nan'):.0f} ms, "
            f"lost {len(ready) - len(lat)}"
        )
        await asyncio.sleep(args.gap)
    cpu_after = group_cpu()
    still_open = sum(1 for t in tasks if not t.done())
    listener.cancel()
    for t in tasks:
        t.cancel()
    return {
        "opened": len(ready), "open_seconds": open_seconds, "still_open": still_open, "rounds": rounds,
        "cpu": (cpu_before, cpu_after),
    }  # fmt: skip


async def _listen(notified: list[float]) -> None:
    """LISTEN to the inbox channel as the stream server does: when each in-app outcome committed."""
    import psycopg

    from notifier.inbox.stream import _conninfo
    from notifier.statusevents.record import INBOX_CHANNEL

    async with await psycopg.AsyncConnection.connect(_conninfo(), autocommit=True) as conn:
        await conn.execute(f"LISTEN {INBOX_CHANNEL}")
        async for _ in conn.notifies():
            notified.append(time.monotonic())


def _stages(title: str, wall_start: float) -> dict[str, float]:
    """Return where a topic send's time went, in ms from the POST: fan-out inserts and in-app worker outcomes."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM min(d.created_at)), extract(epoch FROM max(d.created_at)),"
            " extract(epoch FROM min(d.sent_at)), extract(epoch FROM max(d.sent_at))"
            " FROM notifier_notification n JOIN notifier_delivery d ON d.notification_id = n.id"
            " WHERE n.payload->>'t' = %s",
            [title],
        )
        row = cursor.fetchone()
    names = ("fanout_first", "fanout_last", "sent_first", "sent_last")
    return {k: (float(v) - wall_start) * 1000 for k, v in zip(names, row or (), strict=False) if v is not None}


def print_topic(args: Any, result: dict[str, Any], rss: float, cpu: float) -> None:
    """Print the figures of a --topic run."""
    rounds = result["rounds"]
    lat = [x for r in rounds for x in r["latencies"]]
    mode = " --direct" if args.direct else " --in-process" if args.in_process else ""
    print(f"\n=== bench/inbox_streams.py --topic{mode} ===")
    opened = f"{result['opened']} of {args.streams} (opened in {result['open_seconds']:.1f} s)"
    print(f"streams open                 {opened}")
    print(f"still open at the end        {result['still_open']}")
    how = "over the API"
    if args.direct:
        how = "delivered in-process (no API, no broker)"
    elif args.in_process:
        how = "accepted and fanned out in-process (no HTTP, no broker)"
    print(
        f"topic sends                  {len(rounds)} in-app notifications to a topic of {args.streams} {how}, "
        f"lost {sum(r['lost'] for r in rounds)} of {len(rounds) * result['opened']} stream events"
    )
    accepts = ", ".join(f"{r['accept_ms']:.0f}" for r in rounds)
    what = (
        "rows inserted (ms)    "
        if args.direct
        else "accept (ms)             "
        if args.in_process
        else "accept (POST -> 202, ms)"
    )
    print(f"{what}     {accepts}")
    for k, r in enumerate(rounds, 1):
        x = r["latencies"]
        print(
            f"  round {k:<3}                 p50 {percentile(x, 50):.0f}  p99 {percentile(x, 99):.0f}  "
            f"max {max(x) if x else float('nan'):.0f}; fan-out rows {r.get('fanout_first', 0):.0f}-"
            f"{r.get('fanout_last', 0):.0f}, sent_at {r.get('sent_first', 0):.0f}-{r.get('sent_last', 0):.0f}, "
            f"NOTIFY {r.get('notify_first', 0):.0f}-{r.get('notify_last', 0):.0f}"
        )
    print(
        f"send -> every stream (ms)    p50 {percentile(lat, 50):.0f}  p95 {percentile(lat, 95):.0f}  "
        f"p99 {percentile(lat, 99):.0f}  max {max(lat) if lat else float('nan'):.0f}  (all rounds)"
    )
    print(f"stream server                RSS {rss:.0f} MB, CPU {cpu:.1f} s during the run")
    print(f"CPU of every process on the box during the rounds, per round of {result['opened']} streams:")
    before, after = result["cpu"]
    print_cpu(before, after, len(rounds), per="round")


def _run(main: Any) -> Any:
    """Run the client's event loop on uvloop (as uvicorn runs the server's): the client is not what is measured."""
    import uvloop

    return uvloop.run(main)


def _make_topic(connection: Any) -> None:
    """Subscribe every bench user to the topic `live`."""
    from preferences.models import Topic

    topic = Topic.objects.create(key="live", name="live")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO preferences_subscription (topic_id, recipient_id, created_at) "
            "SELECT %s, id, now() FROM preferences_recipient WHERE user_id LIKE 'live-%%' ORDER BY id",
            [topic.pk],
        )
        cursor.execute("ANALYZE preferences_recipient; ANALYZE preferences_subscription")


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--streams", type=int, default=10_000)
    p.add_argument("--messages", type=int, default=300)
    p.add_argument("--rate", type=float, default=20.0, help="messages per second")
    p.add_argument("--step", type=int, default=500, help="streams opened at once")
    p.add_argument("--port", type=int, default=18766)
    p.add_argument("--hold", type=float, default=20.0, help="seconds to keep the streams open after the messages")
    p.add_argument("--topic", action="store_true", help="one in-app notification to a topic of all the streams' users")
    p.add_argument("--stream-workers", type=int, default=1, help="uvicorn processes of the stream server")
    p.add_argument("--rounds", type=int, default=5, help="--topic: how many topic sends")
    p.add_argument("--batch", type=int, default=500, help="--topic --direct: deliveries per worker batch")
    p.add_argument("--threads", type=int, default=8, help="--topic --direct: batches delivered at once")
    p.add_argument("--gap", type=float, default=2.0, help="--topic: seconds between rounds")
    p.add_argument("--wait", type=float, default=30.0, help="--topic: seconds a round waits for every stream")
    p.add_argument(
        "--direct", action="store_true", help="deliver in this process (no API, no broker): store -> screen only"
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="--topic: accept and fan out in this process (no HTTP, no broker): accept -> fan-out -> screen",
    )
    args = p.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.streams + 500:
        sys.exit(f"RLIMIT_NOFILE hard limit {hard} is too low for {args.streams} streams")
    # --topic --direct needs no broker (nor does it purge one that may be busy).
    broker = not (args.topic and (args.direct or args.in_process))
    prepare(broker=broker)
    server = api = None
    try:
        from django.db import connection

        from notifier.inbox.tokens import inbox_token_mint
        from preferences.models import Recipient
        from templates_app.services import template_put

        content = {"en": {"inapp": {"title": "{{ t }}", "body": "live message {{ t }}"}}}
        template_put(key="live", category="transactional", default_locale="en", content=content)
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO preferences_recipient (user_id, email, phone, locale, timezone, webhook_url, opted_out, "
                "channel_prefs, category_prefs, created_at, updated_at) "
                "SELECT 'live-' || g, '', '', '', '', '', false, '{}', '{}', now(), now()"
                " FROM generate_series(1, %s) g",
                [args.streams],
            )
        streams = [
            Stream(r.user_id, inbox_token_mint(recipient=r, ttl_seconds=7200)[0])
            for r in Recipient.objects.filter(user_id__startswith="live-").only("id", "user_id")
        ]
        from notifier.clients.services import api_client_create

        # A topic send needs the topics scope beside send.
        client, key = api_client_create(name="bench-live", scopes=["send", "topics"])
        server = StreamServer(args.port, args.stream_workers)
        if args.topic and args.in_process:
            _make_topic(connection)
        if args.topic and (args.direct or args.in_process):
            cpu_before = server.usage()[1]
            topic_result = _run(measure_topic(args, streams, args.port, "", key, client.pk))
            rss, cpu_after = server.usage()
            print_topic(args, topic_result, rss, cpu_after - cpu_before)
            return
        if args.topic:
            _make_topic(connection)
            api = ApiServer(port=args.port + 1).wait_ready()
            # As the Procfile runs them: the fan-out worker, and the high-priority send worker's in-app queue.
            fanout = Worker("live-fanout", ["fanout"], concurrency=2)
            inapp = Worker("live-inapp", ["inapp.high"], concurrency=8, pool="threads")
            with workers(fanout, inapp):
                cpu_before = server.usage()[1]
                topic_result = _run(measure_topic(args, streams, args.port, api.url, key))
                rss, cpu_after = server.usage()
            print_topic(args, topic_result, rss, cpu_after - cpu_before)
            return
        if args.direct:
            cpu_before = server.usage()[1]
            result = _run(measure(args, streams, args.port, "", key, client.pk))
            rss, cpu_after = server.usage()
        else:
            api = ApiServer(port=args.port + 1).wait_ready()
            inapp = Worker("live-inapp", ["inapp.high"], concurrency=8, pool="threads")
            with workers(inapp):
                cpu_before = server.usage()[1]
                result = _run(measure(args, streams, args.port, api.url, key, client.pk))
                rss, cpu_after = server.usage()
        lat = cast(list[float], result["latencies"])
        print("\n=== bench/inbox_streams.py ===")
        print(
            f"streams open                 {result['opened']} of {args.streams}"
            f" (opened in {result['open_seconds']:.1f} s)"
        )
        print(
            f"still open at the end        {result['still_open']} ({result['with_heartbeat']} had a heartbeat,"
            f" held {args.hold:.0f} s more)"
        )
        how = "delivered in-process (no API, no broker)" if args.direct else "over the HTTP API"
        print(f"messages                     {args.messages} at {args.rate:.0f}/s {how}, lost {result['lost']}")
        print(
            f"send -> received (ms)        p50 {percentile(lat, 50):.0f}  p95 {percentile(lat, 95):.0f}  "
            f"p99 {percentile(lat, 99):.0f}  max {max(lat) if lat else float('nan'):.0f}  mean {mean(lat):.0f}"
        )
        print(f"stream server                RSS {rss:.0f} MB, CPU {cpu_after - cpu_before:.1f} s during the run")
    finally:
        if server:
            server.stop()
        if api:
            api.stop()
        cleanup(args.keep, broker=broker)


if __name__ == "__main__":
    main()
