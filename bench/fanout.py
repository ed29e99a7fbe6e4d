"""Fan-out of a topic of 1,000,000 subscribers: time until every delivery is created and queued, worker RSS.

    .venv/bin/python bench/fanout.py [--subscribers 1000000] [--page 5000] [--lanes 2] [--keep]

Prints the time from accept to the notification's fan-out done (all deliveries inserted, published in
messages of 500 ids, checkpoints saved), deliveries per second, the fan-out worker's RSS sampled every half
second (start, peak, end: flat memory means the peak does not grow with the topic), and the empty-Celery-task
rate measured in the same run on the same broker.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Worker, cleanup, empty_task_rate, log, make_template, make_topic, parser, prepare, workers


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--subscribers", type=int, default=1_000_000)
    p.add_argument("--page", type=int, default=5000)
    p.add_argument("--lanes", type=int, default=2, help="FANOUT_LANES, and the fan-out worker's concurrency")
    args = p.parse_args()
    prepare()
    try:
        run(args.subscribers, args.page, args.lanes, args.timeout)
    finally:
        cleanup(args.keep)


def run(subscribers: int, page: int, lanes: int, timeout: float) -> None:
    from notifier.accepting.services import notification_accept
    from notifier.clients.services import api_client_create
    from notifier.deliveries.models import Delivery, Notification

    noop = empty_task_rate()
    log(f"empty task: publish {noop['publish_per_s']:.0f}/s, publish+consume {noop['end_to_end_per_s']:.0f}/s")

    started = time.monotonic()
    make_template("sale", "marketing")
    make_topic("everyone", subscribers)
    log(f"created {subscribers} subscribers in {time.monotonic() - started:.1f}s")
    client = api_client_create(name="bench-fanout")[0]

    worker = Worker("fanout", ["fanout"], concurrency=lanes, FANOUT_PAGE_SIZE=str(page), FANOUT_LANES=str(lanes))
    samples: list[int] = []
    with workers(worker):
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append(worker.rss_bytes())
                time.sleep(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        time.sleep(1)
        t0 = time.monotonic()
        data = {"topic": "everyone", "category": "marketing", "template": "sale", "channels": ["email"]}
        notification = notification_accept(client=client, data={**data, "payload": {"n": 1}}).notification
        last = -1
        while time.monotonic() - t0 < timeout:
            n = Notification.objects.only("status", "fanout_processed").get(pk=notification.pk)
            if n.status == Notification.Status.DONE:
                break
            if n.fanout_processed // 100_000 != last // 100_000:
                log(f"  {n.fanout_processed} subscribers after {time.monotonic() - t0:.1f}s")
            last = n.fanout_processed
            time.sleep(0.25)
        elapsed = time.monotonic() - t0
        stop.set()
        sampler.join()
    n = Notification.objects.get(pk=notification.pk)
    deliveries = Delivery.objects.filter(notification=n).count()
    queued_unpublished = Delivery.objects.filter(notification=n, status="queued", published_at__isnull=True).count()
    from config.celery import app

    with app.connection_for_write() as conn:
        declared = app.amqp.queues["email.low"](conn.channel()).queue_declare(passive=True)
        _, messages, _ = cast("tuple[str, int, int]", declared)  # a passive declare answers this tuple
    mb = [s / 2**20 for s in samples if s]
    tenth = max(1, len(mb) // 10)
    print("\n=== bench/fanout.py ===")
    print(f"topic subscribers           {subscribers}   (lanes {lanes}, page {page})")
    print(f"fan-out status              {n.status} (recipients_total={n.recipients_total})")
    print(f"deliveries created          {deliveries}   queued-but-unpublished: {queued_unpublished}")
    print(f"messages in email.low       {messages}   (500 ids each)")
    print(f"accept -> all created+queued {elapsed:.1f} s   ({deliveries / elapsed:.0f} deliveries/s; target <= 60 s)")
    print(
        f"fan-out worker RSS (MiB)    start {mb[0]:.0f}, peak {max(mb):.0f}, end {mb[-1]:.0f}; "
        f"max of first tenth {max(mb[:tenth]):.0f} vs last tenth {max(mb[-tenth:]):.0f}"
    )
    print(
        f"empty Celery task           publish {noop['publish_per_s']:.0f}/s, publish+consume "
        f"{noop['end_to_end_per_s']:.0f}/s (2 prefork processes, late acks, confirms)"
    )
    ratio = deliveries / elapsed / noop["end_to_end_per_s"]
    print(f"fan-out vs empty task       {ratio:.1f}x (deliveries/s over empty tasks/s)")


if __name__ == "__main__":
    main()
