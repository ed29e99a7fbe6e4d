"""A burst of singles on the send worker: one delivery id per broker message, gathered into batches or not.

    BENCH_NS=me .venv/bin/python bench/send_singles.py [--singles 3000] [--concurrency 8]

No API: --singles single notifications (each its own notification, one email delivery, sandbox provider) are
written with the ORM and published one id per message to `email.high`; then a send worker starts as
`worker_high` runs (threads x --concurrency) and drains them. Three loads, one after the other in one run, each
on fresh deliveries:

- singles, each message alone (SEND_GATHER_MAX=1: the send path before gathering);
- singles, gathered (the shipped default: a task takes the messages waiting behind its own into its batch);
- the same deliveries as fan-out pages (SEND_BATCH_SIZE ids per message), the cost to match.

Prints for each: deliveries/s from the first claim to the last `sent_at` the database recorded, the send
worker's CPU per delivery (its process tree, from the end of its start-up), PostgreSQL's and RabbitMQ's (every
process of those servers on the box: other loads on a shared box show up there, the worker's own figure does
not move with them) and the number of distinct claims (one claim statement stamps its rows with one time).
Compare figures of one run only.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Worker, cleanup, log, parser, prepare, service_cpu_seconds, wait_until, workers

QUEUE = "email.high"


def _singles(n: int, tag: str) -> list[int]:
    """Write n single notifications with one queued email delivery each; return the delivery ids."""
    from notifier.clients.services import api_client_create
    from notifier.deliveries.models import Delivery, Notification
    from preferences.models import Recipient

    client = api_client_create(name=f"singles-{tag}")[0]
    recipients = Recipient.objects.bulk_create(
        [Recipient(user_id=f"{tag}-{i}", email=f"{tag}-{i}@example.com") for i in range(n)]
    )
    notifications = Notification.objects.bulk_create(
        [
            Notification(
                client=client, category="transactional", template_key="single", template_version=1,
                channels=["email"], payload={"n": i}, user_id=r.user_id, priority="high",
            )
            for i, r in enumerate(recipients)
        ]
    )  # fmt: skip
    deliveries = Delivery.objects.bulk_create(
        [
            Delivery(notification=notification, recipient=r, channel="email", priority="high", address=r.email)
            for notification, r in zip(notifications, recipients, strict=True)
        ]
    )
    return [d.pk for d in deliveries]


def _load(name: str, ids: list[int], *, per_message: int, **env: str) -> dict[str, Any]:
    """Run one send worker, publish `ids` `per_message` per message, wait until all are sent; return figures."""
    from django.db import connection

    from notifier.deliveries.outbox import publish

    # The burst is on the queue before the worker starts: what is measured is the worker draining it.
    assert len(publish({QUEUE: ids}, batch_size=per_message)) == len(ids)
    worker = Worker(f"singles-{name}", [QUEUE], concurrency=ARGS.concurrency, pool="threads", **env)
    with workers(worker):
        cpu0, services0 = worker.cpu_seconds(), service_cpu_seconds()

        def sent() -> bool:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM notifier_delivery WHERE id = ANY(%s) AND status = 'sent'", [ids])
                return cursor.fetchone()[0] == len(ids)

        wait_until(sent, timeout=900, interval=0.5, what=f"{name}: every delivery sent")
        cpu1, services1 = worker.cpu_seconds(), service_cpu_seconds()
    with connection.cursor() as cursor:
        # From the first claim to the last answer recorded, on the database's clock.
        cursor.execute(
            "SELECT extract(epoch FROM (SELECT max(sent_at) FROM notifier_delivery WHERE id = ANY(%s)) - min(at)),"
            " count(DISTINCT at) FROM notifier_deliveryevent WHERE delivery_id = ANY(%s) AND status = 'sending'",
            [ids, ids],
        )
        span, claims = cursor.fetchone()
    n = len(ids)
    return {
        "name": name, "rate": n / float(span), "claims": claims,
        "worker_ms": (cpu1 - cpu0) / n * 1000,
        "pg_ms": (services1["postgresql"] - services0["postgresql"]) / n * 1000,
        "mq_ms": (services1["rabbitmq"] - services0["rabbitmq"]) / n * 1000,
    }  # fmt: skip


def main() -> None:
    global ARGS
    p = parser(__doc__ or "")
    p.add_argument("--singles", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=8, help="threads of the send worker (worker_high: 8)")
    ARGS = p.parse_args()
    prepare()
    try:
        from django.conf import settings

        from templates_app.services import template_put

        template_put(
            key="single", category="transactional", default_locale="en",
            content={"en": {"email": {"subject": "n {{ n }}", "text": "t"}}},
        )  # fmt: skip
        loads = [
            ("alone", 1, {"SEND_GATHER_MAX": "1"}),
            ("gathered", 1, {}),
            ("pages", settings.SEND_BATCH_SIZE, {}),
        ]
        results = []
        for name, per_message, env in loads:
            ids = _singles(ARGS.singles, f"{name}-{time.time_ns()}")
            log(f"{name}: {len(ids)} deliveries, {per_message} per message")
            results.append(_load(name, ids, per_message=per_message, **env))
        print(
            f"\n=== bench/send_singles.py ({ARGS.singles} deliveries per load, worker threads x {ARGS.concurrency}) ==="
        )
        print(
            f"{'load':<10} {'deliveries/s':>12} {'claims':>7} {'worker ms':>10} {'postgres ms':>12} {'rabbitmq ms':>12}"
        )
        for r in results:
            print(f"{r['name']:<10} {r['rate']:12.0f} {r['claims']:7d} {r['worker_ms']:10.2f} {r['pg_ms']:12.2f}"
                  f" {r['mq_ms']:12.2f}")  # fmt: skip
        alone, gathered, pages = results
        print(f"gathered vs alone: {gathered['rate'] / alone['rate']:.2f}x deliveries/s, worker CPU per delivery "
              f"{gathered['worker_ms'] / alone['worker_ms']:.2f}x; gathered vs pages: worker CPU per delivery "
              f"{gathered['worker_ms'] / pages['worker_ms']:.2f}x")  # fmt: skip
    finally:
        cleanup(ARGS.keep)


ARGS: Any = None

if __name__ == "__main__":
    main()
