"""The Prometheus scrape: helper-driven series, queue depths from RabbitMQ and pending dead letters."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from pytest_django import Settings

from config.celery import app as celery_app
from core import metrics
from tests.conftest import purge_all_queues, queue_depth
from tests.factories import make_dead_letter


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics (no API key) and return {(sample name, sorted labels): value}."""
    response = Client().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    """Return one sample's value (0 when the series does not exist yet)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.django_db
def test_helpers_show_up_in_the_scrape() -> None:
    """Every helper moves its series, and the scrape exposes them in Prometheus text format."""
    before = scrape()
    metrics.count_accepted("transactional", "billing")
    metrics.count_deliveries("email", "ses", "sent", n=3)
    metrics.count_deliveries("email", "ses", "failed")
    metrics.observe_provider_call("ses", 0.12, "ok")
    metrics.observe_provider_call("ses", 7.0, "timeout")
    metrics.count_throttled("twilio")
    metrics.set_breaker_state("fcm", "open")
    metrics.fanout_progress(created=500, channel="push", done=True)
    metrics.count_republished(2)
    after = scrape()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("notifier_notifications_accepted_total", category="transactional", client="billing", mode="live") == 1
    assert delta("notifier_deliveries_total", channel="email", provider="ses", status="sent", mode="live") == 3
    assert delta("notifier_deliveries_total", channel="email", provider="ses", status="failed", mode="live") == 1
    assert delta("notifier_provider_call_seconds_count", provider="ses", outcome="ok") == 1
    assert delta("notifier_provider_call_seconds_bucket", provider="ses", outcome="ok", le="0.25") == 1
    assert delta("notifier_provider_call_seconds_bucket", provider="ses", outcome="timeout", le="5.0") == 0
    assert delta("notifier_provider_call_seconds_bucket", provider="ses", outcome="timeout", le="10.0") == 1
    assert delta("notifier_provider_throttled_total", provider="twilio") == 1
    assert value(after, "notifier_breaker_state", provider="fcm") == 2
    assert delta("notifier_fanout_deliveries_created_total", channel="push") == 500
    assert delta("notifier_fanouts_completed_total") == 1
    assert delta("notifier_outbox_republished_total") == 2
    # The scrape itself went through the middleware and was counted.
    assert delta("notifier_http_requests_total", method="GET", route="metrics", status="200") >= 1


@pytest.mark.django_db
def test_queue_depths_are_read_from_rabbitmq_at_scrape_time() -> None:
    """Messages waiting in a queue show as its depth; dead-letter queues have their own series."""
    purge_all_queues()
    for _ in range(3):
        celery_app.send_task("notifier.retention.purge_old_deliveries", queue="webhook.low")
    assert queue_depth("webhook.low") == 3
    try:
        samples = scrape()
    finally:
        purge_all_queues()
    assert value(samples, "notifier_broker_up") == 1
    assert value(samples, "notifier_queue_depth", queue="webhook.low") == 3
    assert value(samples, "notifier_queue_depth", queue="email.high") == 0
    assert ("notifier_queue_consumers", (("queue", "webhook.low"),)) in samples
    assert value(samples, "notifier_dead_letter_queue_depth", queue="dead.email") == 0
    assert ("notifier_dead_letter_queue_depth", (("queue", "dead.email"),)) in samples
    # Dead-letter queues are not mixed into the work-queue series.
    assert ("notifier_queue_depth", (("queue", "dead.email"),)) not in samples


@pytest.mark.django_db
def test_scrape_survives_an_unreachable_broker(settings: Settings) -> None:
    """With RabbitMQ down the scrape still answers, and says so with notifier_broker_up 0."""
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:9//"
    samples = scrape()
    assert value(samples, "notifier_broker_up") == 0
    assert not any(name == "notifier_queue_depth" for name, _ in samples)


@pytest.mark.django_db
def test_pending_dead_letters_are_counted_per_channel() -> None:
    """Pending dead letters in PostgreSQL are a gauge per channel; replayed ones are not counted."""
    from notifier.deadletters.models import DeadLetter
    from tests.ops.test_ops_retention import make_delivery

    d1 = make_delivery(channel="sms", status="failed")
    d2 = make_delivery(channel="sms", status="failed")
    make_dead_letter(delivery=d1, channel="sms", queue="sms.high", reason="exhausted")
    make_dead_letter(
        delivery=d2, channel="sms", queue="sms.high", reason="exhausted", status=DeadLetter.Status.REPLAYED
    )
    samples = scrape()
    assert value(samples, "notifier_dead_letters_pending", channel="sms") == 1


def test_multiprocess_mode_aggregates_every_process(tmp_path: Path) -> None:
    """With PROMETHEUS_MULTIPROC_DIR, counts made in separate processes add up in one scrape."""
    code = textwrap.dedent(
        """
        import django, os, sys
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        django.setup()
        from core import metrics
        if sys.argv[1] == "count":
            metrics.count_deliveries("push", "fcm", "sent", n=5)
            metrics.set_breaker_state("fcm", sys.argv[2])
        else:
            sys.stdout.write(metrics.render_metrics().decode())
        """
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "METRICS_QUEUE_DEPTHS": "false"}
    root = Path(__file__).resolve().parents[2]
    for state in ("open", "closed"):
        subprocess.run([sys.executable, "-c", code, "count", state], env=env, cwd=root, check=True)
    out = subprocess.run(
        [sys.executable, "-c", code, "scrape"], env=env, cwd=root, check=True, capture_output=True, text=True
    ).stdout
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(out)
        for s in family.samples
    }
    assert value(samples, "notifier_deliveries_total", channel="push", provider="fcm", status="sent", mode="live") == 10
    # The breaker gauge keeps the most recent value written by any process.
    assert value(samples, "notifier_breaker_state", provider="fcm") == 0
