"""OTP latency while a campaign drains, or while singles flood in: p50/p99 of accept -> handed to the provider.

    .venv/bin/python bench/priority.py [--recipients 100000] [--rate 100000] [--otps 60]
    .venv/bin/python bench/priority.py --load singles [--clients 16] [--otps 60]
    .venv/bin/python bench/priority.py --load topic-high [--recipients 100000] [--pace '*=1000'] [--otps 60]

A campaign to a topic of N recipients (marketing, low priority, capped at --rate per second) drains through
its own low-queue workers; meanwhile an OTP (security, high priority) is POSTed to the real HTTP API once a
second, served by separate high-queue workers (priorities need separate queues and processes, or an OTP
waits behind the campaign).
Latency per OTP is its delivery's sent_at minus its notification's created_at. Target p99 <= 500 ms.

With `--load singles` there is no campaign: --clients HTTP clients send single notifications (social, normal
priority, which travels on the low queue) as fast as the API takes them for the whole run, as bench/singles.py
does, and the OTPs are measured against that.

With `--load topic-high` a transactional template is sent to a topic of N recipients at high priority over the
HTTP API: its deliveries travel on `email.high`, the OTPs' own queue and workers (8 threads, as the high worker
class runs). The fan-out fills the high queue at `--pace` (FANOUT_HIGH_PACE, default the setting's own;
`'*=0'` turns pacing off, for comparison); the figures say how long the topic took to drain besides the OTPs'.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ApiServer,
    Worker,
    api_key,
    cleanup,
    empty_task_rate,
    log,
    make_template,
    make_topic,
    parser,
    percentile,
    prepare,
    wait_until,
    workers,
)


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--recipients", type=int, default=100_000)
    p.add_argument("--rate", type=int, default=100_000)
    p.add_argument("--otps", type=int, default=60)
    p.add_argument("--load", choices=["campaign", "singles", "topic-high"], default="campaign")
    p.add_argument("--pace", default="", help="with --load topic-high: FANOUT_HIGH_PACE of the workers")
    p.add_argument("--clients", type=int, default=16, help="with --load singles: concurrent HTTP clients")
    args = p.parse_args()
    prepare()
    try:
        run(args)
    finally:
        cleanup(args.keep)


def run(args: argparse.Namespace) -> None:
    from django.db.models import Max

    from notifier.campaigns.services import campaign_create
    from notifier.clients.models import ApiClient
    from notifier.deliveries.models import Delivery
    from preferences.models import Recipient

    noop = empty_task_rate()
    make_template("promo", "marketing")
    make_template("otp", "security")
    make_template("news", "social")
    make_template("receipt", "transactional")
    if args.load in ("campaign", "topic-high"):
        make_topic("everyone", args.recipients)
    else:
        Recipient.objects.bulk_create(
            [Recipient(user_id=f"load-{i}", email=f"load-{i}@example.com") for i in range(args.recipients)],
            batch_size=5000,
        )
    key = api_key()
    client = ApiClient.objects.get()
    Recipient.objects.create(user_id="otp-user", email="otp@example.com")
    server = ApiServer()
    low = Worker("prio-low", ["email.low"], concurrency=2)
    pace_env = {"FANOUT_HIGH_PACE": args.pace} if args.pace else {}
    if args.load == "topic-high":
        # Two fan-out processes for the topic's two lanes, sharing one pace; the high class as it ships.
        fan = Worker("prio-fanout", ["fanout", "maintenance"], concurrency=2, **pace_env)
        high = Worker("prio-high", ["email.high"], concurrency=8, pool="threads")
    else:
        fan = Worker("prio-fanout", ["fanout", "maintenance"], concurrency=1)
        high = Worker("prio-high", ["email.high"], concurrency=1, pool="threads")
    try:
        server.wait_ready()
        with workers(low, fan, high):
            stop = threading.Event()
            loaders: list[threading.Thread] = []
            topic_drain = (0.0, 0)
            if args.load == "campaign":
                campaign_create(
                    client=client, name="bench", template="promo", topic="everyone", channels=["email"],
                    payload={"n": 1}, rate_per_second=args.rate,
                )  # fmt: skip
                campaign_sent = Delivery.objects.filter(notification__campaign__isnull=False, status="sent")
            elif args.load == "topic-high":
                topic_id = _send_topic(server.url, key)
                campaign_sent = Delivery.objects.filter(notification_id=topic_id, status="sent")
            else:
                loaders = [
                    threading.Thread(target=_singles_load, args=(server.port, key, c, args, stop))
                    for c in range(args.clients)
                ]
                for t in loaders:
                    t.start()
                campaign_sent = Delivery.objects.filter(notification__template_key="news", status="sent")
            load_started = time.monotonic()
            ids: list[str] = []
            for i in range(args.otps):
                started = time.monotonic()
                body = {"recipient": {"user_id": "otp-user"}, "category": "security", "template": "otp"}
                body |= {"channels": ["email"], "payload": {"n": i}}
                request = urllib.request.Request(
                    f"{server.url}/api/v1/notifications",
                    data=json.dumps(body).encode(),
                    headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                )
                ids.append(json.loads(urllib.request.urlopen(request, timeout=30).read())["id"])
                if i % 10 == 0:
                    log(f"  otp {i}; campaign sent so far {campaign_sent.count()}")
                time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
            stop.set()
            for t in loaders:
                t.join()
            load_seconds = time.monotonic() - load_started
            otps = Delivery.objects.filter(notification_id__in=ids)
            wait_until(lambda: otps.filter(status="sent").count() == len(ids), timeout=120, what="otps sent")
            during = campaign_sent.count()
            if args.load == "topic-high":
                # The topic drains on: measure how long it took in all (its pace shows here).
                wait_until(lambda: campaign_sent.count() >= args.recipients, timeout=1800, what="topic drained")
                topic_drain = (time.monotonic() - load_started, campaign_sent.count())
            drained_at = campaign_sent.aggregate(last=Max("sent_at"))["last"]
    finally:
        server.stop()
    # Every OTP was waited for until sent: sent_at is set.
    rows = [(d.notification.created_at, cast(datetime, d.sent_at)) for d in otps.select_related("notification")]
    latencies = [(sent - accepted).total_seconds() * 1000 for accepted, sent in rows]
    # The OTPs accepted while campaign (or load) deliveries were still being sent: the ones the target is about.
    draining = [(sent - accepted).total_seconds() * 1000 for accepted, sent in rows if accepted <= drained_at]
    print("\n=== bench/priority.py ===")
    if args.load == "topic-high":
        from django.conf import settings

        print(
            f"topic (high, transactional) {args.recipients} recipients, pace {args.pace or settings.FANOUT_HIGH_PACE}"
        )
        print(f"topic deliveries sent while OTPs ran  {during}")
        seconds, total = topic_drain
        print(f"topic drained               {total} in {seconds:.1f} s ({total / seconds:.0f}/s) from its accept")
    elif args.load == "campaign":
        print(f"campaign                    {args.recipients} recipients, cap {args.rate}/s")
        print(f"campaign deliveries sent while OTPs ran  {during}")
    else:
        print(f"singles load                {args.clients} HTTP clients, normal priority (social, email.low)")
        print(f"singles sent while OTPs ran {during} ({during / load_seconds:.0f}/s)")
    print(f"OTPs                        {len(latencies)} (one a second through the HTTP API)")
    print(
        f"OTP accept -> provider (ms) while the {args.load} load was being sent ({len(draining)} OTPs): "
        f"p50 {percentile(draining, 50):.0f}, p99 {percentile(draining, 99):.0f}, max {max(draining, default=0):.0f}"
        "  (target p99 <= 500)"
    )
    print(
        f"OTP accept -> provider (ms) all {len(latencies)}: p50 {percentile(latencies, 50):.0f}, "
        f"p99 {percentile(latencies, 99):.0f}, max {max(latencies):.0f}"
    )
    print(f"empty Celery task           {noop['end_to_end_per_s']:.0f}/s publish+consume")


def _send_topic(base_url: str, key: str) -> str:
    """POST a transactional template to the whole topic at high priority; return the notification id."""
    body: dict[str, object] = {"topic": "everyone", "template": "receipt", "category": "transactional"}
    body["priority"] = "high"
    body |= {"channels": ["email"], "payload": {"n": 0}}
    request = urllib.request.Request(
        f"{base_url}/api/v1/notifications",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    return str(json.loads(urllib.request.urlopen(request, timeout=30).read())["id"])


def _singles_load(port: int, key: str, client_no: int, args: argparse.Namespace, stop: threading.Event) -> None:
    """Send normal-priority single notifications over one keep-alive connection until `stop` is set."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    i = 0
    while not stop.is_set():
        user = f"load-{(client_no * 7919 + i) % args.recipients}"
        body = {"recipient": {"user_id": user}, "category": "social", "template": "news", "channels": ["email"]}
        body["payload"] = {"n": i}
        conn.request("POST", "/api/v1/notifications", json.dumps(body), headers)
        conn.getresponse().read()
        i += 1
    conn.close()


if __name__ == "__main__":
    main()
