"""OTP latency while a campaign drains: p50/p99 of accept -> handed to the provider.

    .venv/bin/python bench/priority.py [--recipients 100000] [--rate 100000] [--otps 60]

A campaign to a topic of N recipients (marketing, low priority, capped at --rate per second) drains through
its own low-queue workers; meanwhile an OTP (security, high priority) is POSTed to the real HTTP API once a
second, served by separate high-queue workers (DESIGN.md: priorities need separate queues and processes).
Latency per OTP is its delivery's sent_at minus its notification's created_at. Target p99 <= 500 ms.
"""

from __future__ import annotations

import argparse
import json
import sys
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
    args = p.parse_args()
    prepare()
    try:
        run(args)
    finally:
        cleanup(args.keep)


def run(args: argparse.Namespace) -> None:
    from django.db.models import Max

    from notifier.campaigns.services import campaign_create
    from notifier.models import ApiClient, Delivery
    from preferences.models import Recipient

    noop = empty_task_rate()
    make_template("promo", "marketing")
    make_template("otp", "security")
    make_topic("everyone", args.recipients)
    key = api_key()
    client = ApiClient.objects.get()
    Recipient.objects.create(user_id="otp-user", email="otp@example.com")
    server = ApiServer()
    low = Worker("prio-low", ["email.low"], concurrency=2)
    fan = Worker("prio-fanout", ["fanout", "maintenance"], concurrency=1)
    high = Worker("prio-high", ["email.high"], concurrency=1, pool="threads")
    try:
        server.wait_ready()
        with workers(low, fan, high):
            campaign_create(
                client=client, name="bench", template="promo", topic="everyone", channels=["email"],
                payload={"n": 1}, rate_per_second=args.rate,
            )  # fmt: skip
            ids: list[str] = []
            campaign_sent = Delivery.objects.filter(notification__campaign__isnull=False, status="sent")
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
            otps = Delivery.objects.filter(notification_id__in=ids)
            wait_until(lambda: otps.filter(status="sent").count() == len(ids), timeout=120, what="otps sent")
            during = campaign_sent.count()
            drained_at = campaign_sent.aggregate(last=Max("sent_at"))["last"]
    finally:
        server.stop()
    # Every OTP was waited for until sent: sent_at is set.
    rows = [(d.notification.created_at, cast(datetime, d.sent_at)) for d in otps.select_related("notification")]
    latencies = [(sent - accepted).total_seconds() * 1000 for accepted, sent in rows]
    # The OTPs that were accepted while campaign deliveries were still being sent: the ones the target is about.
    draining = [(sent - accepted).total_seconds() * 1000 for accepted, sent in rows if accepted <= drained_at]
    print("\n=== bench/priority.py ===")
    print(f"campaign                    {args.recipients} recipients, cap {args.rate}/s")
    print(f"campaign deliveries sent while OTPs ran  {during}")
    print(f"OTPs                        {len(latencies)} (one a second through the HTTP API)")
    print(
        f"OTP accept -> provider (ms) while the campaign drained ({len(draining)} OTPs): "
        f"p50 {percentile(draining, 50):.0f}, p99 {percentile(draining, 99):.0f}, max {max(draining, default=0):.0f}"
        "  (target p99 <= 500)"
    )
    print(
        f"OTP accept -> provider (ms) all {len(latencies)}: p50 {percentile(latencies, 50):.0f}, "
        f"p99 {percentile(latencies, 99):.0f}, max {max(latencies):.0f}"
    )
    print(f"empty Celery task           {noop['end_to_end_per_s']:.0f}/s publish+consume")


if __name__ == "__main__":
    main()
