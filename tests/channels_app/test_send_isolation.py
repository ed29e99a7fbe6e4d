"""A batch is how work travels, a delivery is what fails: poison deliveries, header injection, re-claims.

Real workers, PostgreSQL, RabbitMQ and Redis; a webhook receiver (the `webhook-id` header names the delivery)
and an SMTP capture server stand in for the providers.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from channels_app.services import deliver
from notifier.deadletters.models import DeadLetter
from notifier.deliveries.models import Delivery, DeliveryEvent
from notifier.deliveries.outbox import relay
from templates_app.services import template_put
from tests.batches import make_batch, poison_client, publish_as_one, statuses, webhook_template
from tests.conftest import wait_for
from tests.factories import make_delivery
from tests.stubs.webhook import TimedReceiver


@pytest.mark.django_db(transaction=True)
def test_one_poison_delivery_fails_alone_in_a_batch_of_500(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str], settings: Any
) -> None:
    """499 deliveries and one whose adapter raises (a malformed per-client secret) in one message of 500."""
    webhook_template()
    url = f"{receiver.url}/hooks"
    ids = make_batch(n=499, address=url)
    [poison] = make_batch(n=1, address=url, client=poison_client())
    batch = [*ids[:250], poison, *ids[250:]]
    lease = 4
    env = {**webhook_env, "WEBHOOK_PROVIDERS": "webhook", "SENDING_LEASE_SECONDS": str(lease)}
    start_worker(queues=["webhook.high"], env=env, concurrency=1)

    publish_as_one(batch)
    wait_for(lambda: statuses(batch)["sent"] == 499 and statuses([poison])["failed"] == 1, timeout=90)

    # Past the lease the relay would hand anything left in `sending` to a worker again: nothing is left.
    time.sleep(lease + 1)
    settings.SENDING_LEASE_SECONDS = lease
    relay()
    time.sleep(2)
    assert statuses(batch) == {"sent": 499, "failed": 1}
    ok = receiver.ok_per_delivery()
    assert set(ok) == set(ids) and all(n == 1 for n in ok.values()), {i: n for i, n in ok.items() if n != 1}
    assert poison not in {h.delivery_id for h in receiver.snapshot()}
    failed = Delivery.objects.get(pk=poison)
    assert failed.last_error.startswith("ConfigurationError: webhook secret is not whsec_<base64>"), failed.last_error
    assert failed.reason == "error:ConfigurationError"
    assert failed.attempts == 1
    assert DeliveryEvent.objects.filter(delivery_id=poison, status="failed").count() == 1
    dead = DeadLetter.objects.get(delivery_id=poison)
    assert dead.reason == "poison" and "ConfigurationError" in dead.last_error
    assert not DeliveryEvent.objects.filter(delivery_id__in=batch, detail__contains="reclaimed").exists()
    assert set(Delivery.objects.filter(pk__in=batch).values_list("attempts", flat=True)) == {1}


@pytest.mark.django_db(transaction=True)
def test_a_subject_rendering_cr_lf_is_sent_with_the_header_cleaned(
    start_worker: Any, smtp_stub: Any, smtp_env: dict[str, str]
) -> None:
    """A payload that puts CR/LF (and a would-be header) into the subject neither fails nor injects a header."""
    template_put(
        key="crlf",
        category="transactional",
        default_locale="en",
        content={"en": {"email": {"subject": "Order {{ ref }}", "text": "Hello"}}},
    )
    evil = "42\r\nBcc: victim@example.net\r\n"
    ids = make_batch(n=3, address="someone@example.com", channel="email", template_key="crlf", payload={"ref": evil})
    start_worker(queues=["email.high"], env={**smtp_env, "EMAIL_PROVIDERS": "smtp"}, concurrency=1)

    publish_as_one(ids, queue="email.high")
    wait_for(lambda: statuses(ids)["sent"] == 3, timeout=60)

    assert len(smtp_stub.messages) == 3
    for mail in smtp_stub.messages:
        assert mail.message["Subject"] == "Order 42 Bcc: victim@example.net"
        assert mail.message["Bcc"] is None
        assert mail.rcpt_tos == ["someone@example.com"]


@pytest.mark.django_db(transaction=True)
def test_a_reclaim_after_lease_expiry_is_an_attempt_and_ends_in_a_dead_letter() -> None:
    """A delivery whose worker died on every attempt is failed and dead-lettered, never sent again."""
    webhook_template()
    stuck = make_delivery(
        channel="webhook",
        status=Delivery.Status.SENDING,
        address="http://127.0.0.1:9/hooks",
        template_key="hook",
        attempts=settings.DELIVERY_MAX_ATTEMPTS,
        claimed_at=timezone.now() - timedelta(seconds=settings.SENDING_LEASE_SECONDS + 5),
    )
    younger = make_delivery(
        channel="webhook",
        status=Delivery.Status.SENDING,
        address="http://127.0.0.1:9/hooks",
        template_key="hook",
        attempts=1,
        claimed_at=timezone.now() - timedelta(seconds=10),
    )

    report = deliver([stuck.pk, younger.pk])

    assert report.claimed == 1  # the younger one's lease still holds: not taken
    stuck.refresh_from_db()
    assert stuck.status == "failed" and stuck.reason == "attempts_exhausted"
    assert stuck.attempts == settings.DELIVERY_MAX_ATTEMPTS + 1
    assert DeadLetter.objects.filter(delivery=stuck, reason="attempts_exhausted").count() == 1
    details = list(DeliveryEvent.objects.filter(delivery=stuck).values_list("status", "detail"))
    assert ("sending", "reclaimed after lease expiry") in details
    assert any(status == "failed" and "lease expired" in detail for status, detail in details)
    younger.refresh_from_db()
    assert younger.status == "sending" and younger.attempts == 1
