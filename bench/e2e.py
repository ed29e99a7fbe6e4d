"""End-to-end throughput: topic notification to `sent`, and single notifications through the real HTTP API.

    .venv/bin/python bench/e2e.py [--subscribers 200000] [--singles 2000] [--send-pool threads --send-concurrency 8]
        [--history-days 14 --history-per-day 1430000]

Part 1: a topic of N subscribers on email, a fan-out worker and send workers on email.low with the sandbox
provider; deliveries per second from accept to the last delivery `sent` (target >= 5,000/s).
Part 2: M single transactional notifications POSTed to the API under gunicorn by 8 client threads, send
workers on email.high; accepted -> sent per second, and its ratio to the empty-Celery-task rate measured in
the same run on the same broker (one message per delivery on this path, so the empty task is the ceiling).
With --history-days D --history-per-day N, D past days of N finished deliveries each are loaded into their day
partitions first (bench/_common.fill_history), to compare the same run on full and empty tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ApiServer,
    Worker,
    add_history_options,
    api_key,
    cleanup,
    empty_task_rate,
    log,
    make_template,
    make_topic,
    parser,
    prepare,
    service_cpu_seconds,
    wait_until,
    workers,
)


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--subscribers", type=int, default=200_000)
    p.add_argument("--singles", type=int, default=2000)
    p.add_argument("--send-pool", default="prefork")
    p.add_argument("--send-concurrency", type=int, default=2)
    add_history_options(p)
    args = p.parse_args()
    prepare(history_days=args.history_days, history_per_day=args.history_per_day)
    try:
        noop = empty_task_rate()
        log(f"empty task: publish+consume {noop['end_to_end_per_s']:.0f}/s")
        topic_rate = topic_to_sent(args)
        single_rate = singles_to_sent(args) if args.singles else 0.0
        print("\n=== bench/e2e.py ===")
        print(f"topic -> sent               {topic_rate:.0f} deliveries/s ({args.subscribers} subscribers)")
        print("                            (target >= 5000/s)")
        print(f"single API accept -> sent   {single_rate:.0f} notifications/s ({args.singles} via HTTP)")
        print(f"empty Celery task           {noop['end_to_end_per_s']:.0f}/s publish+consume")
        print(f"single / empty-task ratio   {single_rate / noop['end_to_end_per_s']:.2f}")
        print(f"send workers                {args.send_pool} x {args.send_concurrency}")
        print(f"history loaded              {args.history_days} days x {args.history_per_day} deliveries")
    finally:
        cleanup(args.keep)


def topic_to_sent(args: argparse.Namespace) -> float:
    from django.db.models import Max

    from notifier.accepting.services import notification_accept
    from notifier.clients.services import api_client_create
    from notifier.deliveries.models import Delivery

    make_template("news", "social")
    make_topic("all", args.subscribers)
    client = api_client_create(name="bench-e2e")[0]
    fan = Worker("e2e-fanout", ["fanout"], concurrency=2)
    send = Worker("e2e-send", ["email.low"], concurrency=args.send_concurrency, pool=args.send_pool)
    with workers(fan, send):
        cpu_before = {"fan-out worker": fan.cpu_seconds(), "send workers": send.cpu_seconds()}
        cpu_before |= service_cpu_seconds()
        data = {"topic": "all", "category": "social", "template": "news", "channels": ["email"], "payload": {"n": 1}}
        notification = notification_accept(client=client, data=data).notification
        t0 = time.monotonic()
        total = args.subscribers

        def sent() -> bool:
            count = Delivery.objects.filter(notification=notification, status="sent").count()
            log(f"  {count} sent after {time.monotonic() - t0:.0f}s")
            return count >= total

        wait_until(sent, timeout=args.timeout, interval=2, what="all sent")
        cpu_after = {"fan-out worker": fan.cpu_seconds(), "send workers": send.cpu_seconds()}
        cpu_after |= service_cpu_seconds()
    # From the accept's commit to the provider's answer for the last delivery, as the database recorded them.
    last = Delivery.objects.filter(notification=notification).aggregate(last=Max("sent_at"))["last"]
    elapsed = (last - notification.created_at).total_seconds()
    print(f"\nCPU per 1,000 deliveries, topic -> sent ({elapsed:.1f} s on 2 cores = {2 * elapsed:.0f} CPU-s):")
    for name, before in cpu_before.items():
        used = cpu_after[name] - before
        print(f"  {name:<16} {used / total * 1000 * 1000:6.0f} ms   ({used:.1f} s)")
    return total / elapsed


def singles_to_sent(args: argparse.Namespace) -> float:
    from django.db.models import Max, Min

    from notifier.deliveries.models import Delivery

    make_template("otp", "security")
    key = api_key()
    n = args.singles
    send = Worker("e2e-high", ["email.high"], concurrency=args.send_concurrency, pool=args.send_pool)
    server = ApiServer()
    try:
        server.wait_ready()
        with workers(send):
            counter = iter(range(n))
            lock = threading.Lock()

            def client() -> None:
                while True:
                    with lock:
                        i = next(counter, None)
                    if i is None:
                        return
                    body = {"recipient": {"user_id": f"s-{i}"}, "category": "security", "template": "otp"}
                    body |= {"channels": ["email"], "payload": {"n": i}}
                    request = urllib.request.Request(
                        f"{server.url}/api/v1/notifications",
                        data=json.dumps(body).encode(),
                        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                    )
                    urllib.request.urlopen(request, timeout=30).read()

            from preferences.models import Recipient

            Recipient.objects.bulk_create(
                [Recipient(user_id=f"s-{i}", email=f"s-{i}@example.com") for i in range(n)], batch_size=5000
            )
            threads = [threading.Thread(target=client) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            qs = Delivery.objects.filter(notification__template_key="otp")
            wait_until(lambda: qs.filter(status="sent").count() >= n, timeout=300, interval=1, what="singles sent")
            span = qs.aggregate(a=Min("notification__created_at"), b=Max("sent_at"))
    finally:
        server.stop()
    return n / (span["b"] - span["a"]).total_seconds()


if __name__ == "__main__":
    main()
