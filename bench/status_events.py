"""Status events during a topic end-to-end run: events delivered per second to a local receiver.

    BENCH_NS=me .venv/bin/python bench/status_events.py [--subscribers 50000] [--max-batch 100] [--baseline]

A topic of N subscribers on email (sandbox provider), a fan-out worker, send workers on email.low and an
event worker (threads) on `events`; the client has an event endpoint for `delivery.sent` pointing at a
receiver in this process (loopback, WEBHOOK_ALLOW_PRIVATE_TARGETS on). Prints the send rate (accept to last
`sent`), the event rate (first to last event received, and accept to last event) and how far the events
trailed the sends. --baseline runs the same topic first without an endpoint, for the send rate's cost.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Worker, cleanup, log, make_template, make_topic, parser, prepare, wait_until, workers

EVENT_ENV = {"WEBHOOK_ALLOW_PRIVATE_TARGETS": "true"}


class Receiver:
    """A loopback HTTP receiver counting the events it is sent (batches unpacked), with arrival times."""

    def __init__(self) -> None:
        self.count = 0
        self.requests = 0
        self.first: float | None = None
        self.last: float | None = None
        self.ids: set[str] = set()
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                events = body["data"] if body.get("type") == "batch" else [body]
                now = time.monotonic()
                with lock:
                    receiver.requests += 1
                    receiver.ids.update(e["id"] for e in events)
                    receiver.count = len(receiver.ids)
                    receiver.first = receiver.first or now
                    receiver.last = now
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/events"


def run_topic(key: str, n: int, *, receiver: Receiver | None, max_batch: int, timeout: float) -> dict[str, float]:
    from django.db.models import Max

    from notifier.accepting.services import notification_accept
    from notifier.clients.services import api_client_create
    from notifier.deliveries.models import Delivery
    from notifier.statusevents.services import event_endpoint_put

    make_topic(key, n)
    client = api_client_create(name=f"bench-{key}")[0]
    if receiver is not None:
        event_endpoint_put(client=client, url=receiver.url, statuses=["sent"], max_batch=max_batch)
    fan = Worker(f"{key}-fanout", ["fanout"], concurrency=2)
    send = Worker(f"{key}-send", ["email.low"], concurrency=2)
    events = Worker(f"{key}-events", ["events"], concurrency=8, pool="threads", **EVENT_ENV)
    with workers(fan, send, events):
        data = {"topic": key, "category": "social", "template": "news", "channels": ["email"], "payload": {"n": 1}}
        t0 = time.monotonic()
        notification = notification_accept(client=client, data=data).notification

        def done() -> bool:
            sent = Delivery.objects.filter(notification=notification, status="sent").count()
            got = receiver.count if receiver else sent
            log(f"  {sent} sent, {got if receiver else '-'} events received after {time.monotonic() - t0:.0f}s")
            return sent >= n and got >= n

        wait_until(done, timeout=timeout, interval=2, what="all sent (and their events)")
    last = Delivery.objects.filter(notification=notification).aggregate(last=Max("sent_at"))["last"]
    send_seconds = (last - notification.created_at).total_seconds()
    result = {"sent_per_s": n / send_seconds, "send_seconds": send_seconds}
    if receiver is not None and receiver.first is not None and receiver.last is not None:
        result |= {
            "events_per_s": n / max(receiver.last - receiver.first, 1e-9),
            "accept_to_last_event_s": receiver.last - t0,
            "events_lag_s": (receiver.last - t0) - send_seconds,
            "requests": receiver.requests,
        }
    return result


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--subscribers", type=int, default=50_000)
    p.add_argument("--max-batch", type=int, default=100)
    p.add_argument("--baseline", action="store_true", help="also run the topic once without an event endpoint")
    args = p.parse_args()
    prepare()
    try:
        make_template("news", "social")
        base = None
        if args.baseline:
            log("baseline: no event endpoint")
            base = run_topic("plain", args.subscribers, receiver=None, max_batch=1, timeout=args.timeout)
        log(f"with an event endpoint (delivery.sent, max_batch {args.max_batch})")
        receiver = Receiver()
        with_events = run_topic(
            "evts", args.subscribers, receiver=receiver, max_batch=args.max_batch, timeout=args.timeout
        )
        print("\n=== bench/status_events.py ===")
        print(f"subscribers                   {args.subscribers}")
        if base:
            print(f"topic -> sent, no endpoint    {base['sent_per_s']:.0f} deliveries/s")
        print(f"topic -> sent, with events    {with_events['sent_per_s']:.0f} deliveries/s")
        print(f"events delivered              {with_events['events_per_s']:.0f} events/s (first to last received)")
        print(f"accept -> last event          {with_events['accept_to_last_event_s']:.1f} s")
        print(f"events trailed the sends by   {with_events['events_lag_s']:.1f} s")
        print(f"requests (max_batch {args.max_batch})       {with_events['requests']:.0f}")
    finally:
        cleanup(args.keep)


if __name__ == "__main__":
    main()
