"""Retried tasks go back to their own queue, also the second time (after a trip through delayed delivery).

A retry with a countdown comes back as a delayed message whose routing key is its delay in bits before the
queue's name; Celery's default retry routes by that key and the message is lost. The fan-out, fallback and
campaign tasks (notifier/dispatch/tasks.py, notifier/campaigns/tasks.py) and the status-event sender retry through
`OwnQueueTask`, which names the
queue. Checked end to end: a real fan-out worker whose database is cut (a TCP relay between it and PostgreSQL)
retries its task several times, and the fan-out finishes once the database is back.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from django.conf import settings

from core.queues import own_queue
from notifier.deliveries.models import Delivery, Notification
from tests.conftest import wait_for
from tests.dispatch.test_fanout import accept_topic, make_client, make_template, make_topic
from tests.stubs.tcp_relay import TcpRelay


@pytest.mark.pure
def test_own_queue_reads_the_queue_behind_a_delay_prefix() -> None:
    assert own_queue("fanout") == "fanout"
    assert own_queue("0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.1.fanout") == "fanout"
    assert own_queue("1.0.webhook.high") == "webhook.high"
    assert own_queue("1.0.nowhere") is None


@pytest.mark.django_db(transaction=True)
def test_a_fanout_task_retried_through_delayed_delivery_comes_back_to_its_queue(start_worker: Any) -> None:
    """Cut the fan-out worker's database long enough for several retries; the fan-out still finishes."""
    make_template()
    topic = make_topic("retried", 40, prefix="rt")
    db = settings.DATABASES["default"]
    tcp = TcpRelay(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)).start()
    try:
        url = f"postgres://{db['USER']}@127.0.0.1:{tcp.port}/{db['TEST']['NAME']}"
        worker = start_worker(queues=["fanout"], env={"DATABASE_URL": url}, concurrency=1)
        tcp.cut()
        notification = accept_topic(make_client(), topic.key, ["email"])

        def retried_twice() -> bool:
            return len(re.findall(r"fanout_topic\[[0-9a-f-]+\] retry: Retry in", worker.log())) >= 2

        # Backoff 2 s with full jitter: the second retry is published from a message that came back through
        # delayed delivery (the routing key that lost it before).
        wait_for(retried_twice, timeout=60, interval=0.5)
        assert not Delivery.objects.filter(notification=notification).exists()
        tcp.restore()
        back = time.monotonic()

        def finished() -> bool:
            notification.refresh_from_db()
            return notification.status == Notification.Status.DONE

        wait_for(finished, timeout=90, interval=0.5)
        print(f"\nfan-out finished {time.monotonic() - back:.1f}s after the database came back")
        assert Delivery.objects.filter(notification=notification).count() == 40
    finally:
        tcp.stop()
