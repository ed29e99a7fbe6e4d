"""The API's background publisher: no confirm in the request thread, concurrent requests share a message."""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from channels_app.services import heartbeat
from config.celery import app as celery_app
from core.scopes import SCOPES
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from notifier.deliveries.outbox import coalescer
from templates_app.services import template_put
from tests.conftest import free_port, purge_all_queues, queue_depth
from tests.factories import make_delivery, make_recipient

CONTENT = {"en": {"email": {"subject": "Bye", "text": "Bye"}}}


def _drain(queue: str) -> list[list[int]]:
    """Take every message off `queue`; return the delivery ids each carried."""
    batches = []
    with celery_app.connection_for_write() as conn:
        simple = conn.SimpleQueue(celery_app.amqp.queues[queue])  # type: ignore[arg-type]  # kombu takes a Queue too
        while True:
            try:
                message = simple.get(block=True, timeout=1)
            except Exception:
                break
            args: Any = message.payload[0]  # Celery's message body: [args, kwargs, embed]
            batches.append([int(i) for i in args[0]])
            message.ack()
        simple.close()
    return batches


@pytest.mark.django_db(transaction=True)
def test_many_quick_accepts_leave_in_few_messages_and_are_marked_published() -> None:
    purge_all_queues()
    rows = [make_delivery(channel="sms", status="queued", address=f"+1415555{i:04d}") for i in range(60)]
    for d in rows:
        coalescer.submit([(d.pk, "sms", "high")])  # as 60 requests' after-commit hooks would
    assert coalescer.wait_idle(20)

    assert Delivery.objects.filter(pk__in=[d.pk for d in rows], published_at__isnull=True).count() == 0
    batches = _drain("sms.high")
    print(f"\n60 submits left in {len(batches)} messages: {[len(b) for b in batches]}")
    assert sorted(i for b in batches for i in b) == sorted(d.pk for d in rows)
    assert len(batches) < 60  # those that arrived while a publish was in flight left together


@pytest.mark.django_db(transaction=True)
def test_a_lone_accept_is_published_without_waiting_for_company() -> None:
    purge_all_queues()
    d = make_delivery(channel="sms", status="queued", address="+14155550000")
    coalescer.submit([(d.pk, "sms", "high")])
    assert coalescer.wait_idle(10)
    d.refresh_from_db()
    assert d.published_at is not None
    assert queue_depth("sms.high") == 1


@pytest.mark.django_db(transaction=True)
def test_normal_priority_singles_wait_for_company_and_leave_in_one_message(settings: Any) -> None:
    """With the publisher idle, singles a few milliseconds apart still share one message (the linger)."""
    settings.PUBLISH_LINGER_MS = 2000
    purge_all_queues()
    rows = [make_delivery(channel="sms", status="queued", address=f"+1415556{i:04d}") for i in range(5)]
    for d in rows:
        coalescer.submit([(d.pk, "sms", "normal")])
        time.sleep(0.01)  # each would have left alone before the publisher learnt to wait
    assert coalescer.wait_idle(20)
    assert _drain("sms.low") == [[d.pk for d in rows]]


@pytest.mark.django_db(transaction=True)
def test_a_high_priority_single_ends_the_wait_and_takes_the_waiting_ones_along(settings: Any) -> None:
    settings.PUBLISH_LINGER_MS = 60_000  # far beyond the wait below: only the OTP can end it
    purge_all_queues()
    normal = make_delivery(channel="sms", status="queued", address="+14155560100")
    otp = make_delivery(channel="sms", status="queued", address="+14155560101")
    coalescer.submit([(normal.pk, "sms", "normal")])
    time.sleep(0.2)
    assert queue_depth("sms.low") == 0  # still waiting for company
    coalescer.submit([(otp.pk, "sms", "high")])
    assert coalescer.wait_idle(10)
    assert _drain("sms.high") == [[otp.pk]]
    assert _drain("sms.low") == [[normal.pk]]


@pytest.mark.django_db(transaction=True)
def test_a_full_message_of_waiting_singles_leaves_without_waiting_out_the_linger(settings: Any) -> None:
    settings.PUBLISH_LINGER_MS = 60_000
    settings.SEND_BATCH_SIZE = 3
    purge_all_queues()
    rows = [make_delivery(channel="sms", status="queued", address=f"+1415556{200 + i:04d}") for i in range(3)]
    coalescer.submit([(d.pk, "sms", "low") for d in rows])
    assert coalescer.wait_idle(10)
    assert _drain("sms.low") == [[d.pk for d in rows]]


@pytest.mark.django_db(transaction=True)
def test_a_server_stopping_gracefully_publishes_what_its_publisher_still_holds(start_process: Any) -> None:
    """SIGTERM to gunicorn: the last request's delivery leaves with the process, not with the relay later."""
    purge_all_queues()
    template_put(key="bye", category="transactional", default_locale="en", content=CONTENT)
    make_recipient(user_id="u-last", email="last@example.com")
    _, key = api_client_create(name="stopping", scopes=list(SCOPES))
    port = free_port()
    server = start_process(
        "api",
        ["gunicorn", "config.wsgi:application", "-b", f"127.0.0.1:{port}", "-w", "1"],
        # A linger far beyond the test: only the exit can make the publisher let go.
        {"PUBLISH_LINGER_MS": "600000", "OUTBOX_RELAY_INTERVAL_SECONDS": "3600"},
    )
    server.wait_ready(lambda: _answers(f"http://127.0.0.1:{port}/healthz"))
    body = json.dumps(
        {"recipient": {"user_id": "u-last"}, "template": "bye", "channels": ["email"], "priority": "normal"}
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/notifications",
        data=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 202
    delivery = Delivery.objects.get(notification__user_id="u-last")
    time.sleep(0.5)
    assert queue_depth("email.low") == 0  # still waiting for company

    server.stop()
    assert server.proc.returncode == 0
    assert queue_depth("email.low") == 1, server.log()[-3000:]
    assert _drain("email.low") == [[delivery.pk]]
    delivery.refresh_from_db()
    assert delivery.published_at is not None  # marked at once: the relay leaves it alone


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.mark.django_db(transaction=True)
def test_the_mark_after_a_publish_leaves_rows_a_worker_already_took() -> None:
    """published_at is written a moment after the publish, and only on rows still queued then."""
    purge_all_queues()
    waiting = make_delivery(channel="sms", status="queued", address="+14155550010")
    taken = make_delivery(channel="sms", status="sent", address="+14155550011")  # claimed and sent meanwhile
    coalescer.submit([(waiting.pk, "sms", "high"), (taken.pk, "sms", "high")])
    assert coalescer.wait_idle(10)
    waiting.refresh_from_db()
    taken.refresh_from_db()
    assert waiting.published_at is not None
    assert taken.published_at is None
    assert sorted(i for b in _drain("sms.high") for i in b) == sorted([waiting.pk, taken.pk])


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_renews_the_lease_of_what_this_process_is_still_sending() -> None:
    old = timezone.now() - timedelta(seconds=100)
    mine = make_delivery(channel="sms", status="sending", address="+14155550001", claimed_at=old)
    done = make_delivery(channel="sms", status="sent", address="+14155550002", claimed_at=old)
    other = make_delivery(channel="sms", status="sending", address="+14155550003", claimed_at=old)
    heartbeat.hold([mine.pk, done.pk])
    try:
        renewed = heartbeat.beat()
    finally:
        heartbeat.release([mine.pk, done.pk])
    assert renewed == 1
    for d in (mine, done, other):
        d.refresh_from_db()
    assert mine.claimed_at is not None and mine.claimed_at > old + timedelta(seconds=90)
    assert done.claimed_at == old and other.claimed_at == old  # not ours, or no longer sending
    assert heartbeat.owned() == []
