"""Open inbox streams held by one stream server, and how fast a new message reaches them.

    BENCH_NS=me .venv/bin/python bench/inbox_streams.py [--streams 10000] [--messages 300] [--rate 20]

Starts the stream server (uvicorn, config.asgi, one process), an in-app worker and the HTTP API (gunicorn) on
the bench database; creates N recipients and opens one SSE stream for each from this process (asyncio raw
sockets, RLIMIT_NOFILE raised); then POSTs M in-app notifications over the API at R per second to random
connected users and measures, per message, the time from just before the POST to the `message` event read
off that user's stream (send -> on screen, less the browser's rendering). Prints open streams, percentiles,
lost messages, and the stream server's memory and CPU. The machine is shared with everything else it runs.
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
    log,
    mean,
    parser,
    percentile,
    prepare,
    stop_process_group,
    wait_until,
    workers,
)


class StreamServer:
    """uvicorn serving config.asgi on the bench database."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.log_path = ROOT / "var" / f"bench-stream-{os.getpid()}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port),
             "--no-access-log", "--backlog", "4096", "--log-level", "warning"],
            cwd=ROOT, env={**os.environ, **ENV}, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

        def up() -> bool:
            try:
                return urllib.request.urlopen(f"{self.url}/healthz", timeout=1).status == 200
            except OSError:
                return False

        wait_until(up, timeout=60, what="the stream server")

    def usage(self) -> tuple[float, float]:
        """Return (RSS in MB, CPU seconds) of the server process."""
        import psutil

        p = psutil.Process(self.proc.pid)
        return p.memory_info().rss / 2**20, sum(p.cpu_times()[:2])

    def stop(self) -> None:
        stop_process_group(self.proc)
        self._log.close()


class Stream:
    """One open SSE connection; records when each marked message arrived."""

    def __init__(self, user: str, token: str) -> None:
        self.user = user
        self.token = token
        self.ready = asyncio.Event()
        self.heartbeats = 0

    async def run(self, port: int, arrivals: dict[str, float]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET /inbox/v1/stream?token={self.token} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        await writer.drain()
        buffer = b""
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            buffer += chunk
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                text = block.decode(errors="replace")
                if "event: unread" in text:
                    self.ready.set()
                elif "event: message" in text:
                    data = text[text.index("data: ") + 6 :].splitlines()[0]
                    title = json.loads(data)["title"]
                    arrivals.setdefault(title, time.monotonic())
                elif ": heartbeat" in text:
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
        from notifier.models import Delivery, Notification
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


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--streams", type=int, default=10_000)
    p.add_argument("--messages", type=int, default=300)
    p.add_argument("--rate", type=float, default=20.0, help="messages per second")
    p.add_argument("--step", type=int, default=500, help="streams opened at once")
    p.add_argument("--port", type=int, default=18766)
    p.add_argument("--hold", type=float, default=20.0, help="seconds to keep the streams open after the messages")
    p.add_argument(
        "--direct", action="store_true", help="deliver in this process (no API, no broker): store -> screen only"
    )
    args = p.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.streams + 500:
        sys.exit(f"RLIMIT_NOFILE hard limit {hard} is too low for {args.streams} streams")
    prepare()
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
        from notifier.services import api_client_create

        client, key = api_client_create(name="bench-live")
        server = StreamServer(args.port)
        if args.direct:
            cpu_before = server.usage()[1]
            result = asyncio.run(measure(args, streams, args.port, "", key, client.pk))
            rss, cpu_after = server.usage()
        else:
            api = ApiServer(port=args.port + 1).wait_ready()
            inapp = Worker("live-inapp", ["inapp.high"], concurrency=8, pool="threads")
            with workers(inapp):
                cpu_before = server.usage()[1]
                result = asyncio.run(measure(args, streams, args.port, api.url, key, client.pk))
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
        cleanup(args.keep)


if __name__ == "__main__":
    main()
