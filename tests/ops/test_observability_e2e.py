"""Observability through the whole path: API → queue → worker → provider, with real workers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from notifier.deliveries.models import Delivery
from preferences.services import recipient_upsert
from templates_app.services import template_put
from tests.conftest import free_port, wait_for

CONTENT = {"en": {"email": {"subject": "Code {{ code }}", "text": "Your code is {{ code }}"}}}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.django_db(transaction=True)
def test_trace_id_and_ids_reach_the_worker_log_without_the_address(api: Any, start_worker: Any) -> None:
    template_put(key="otp", category="security", default_locale="en", content=CONTENT)
    recipient_upsert(user_id="u-trace", email="secret.person@example.com")
    worker = start_worker(env={"LOG_FORMAT": "json"})
    response = api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": "u-trace"}, "category": "security", "template": "otp", "payload": {"code": 1}},
        format="json",
        HTTP_TRACEPARENT=f"00-{TRACE_ID}-00f067aa0ba902b7-01",
    )
    assert response.status_code == 202
    assert TRACE_ID in response["traceparent"]
    delivery_id = response.json()["deliveries"][0]["id"]
    wait_for(lambda: Delivery.objects.filter(pk=delivery_id, status="sent").exists())

    def sent_line() -> dict[str, Any] | None:
        for line in worker.log().splitlines():
            if line.startswith("{") and '"delivery sent"' in line:
                record = json.loads(line)
                if record.get("delivery_id") == delivery_id:
                    return record
        return None

    record = wait_for(sent_line, timeout=10)
    assert record["trace_id"] == TRACE_ID
    assert record["notification_id"] == response.json()["id"]
    assert record["provider"] == "sandbox"
    assert "secret.person@example.com" not in worker.log()


@pytest.mark.django_db(transaction=True)
def test_metrics_expose_accepted_and_delivered_series(api: Any, start_worker: Any) -> None:
    template_put(key="otp", category="security", default_locale="en", content=CONTENT)
    recipient_upsert(user_id="u-m", email="m@example.com")
    start_worker()
    response = api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": "u-m"}, "category": "security", "template": "otp", "payload": {"code": 2}},
        format="json",
    )
    delivery_id = response.json()["deliveries"][0]["id"]
    wait_for(lambda: Delivery.objects.filter(pk=delivery_id, status="sent").exists())
    scrape = api.get("/metrics").content.decode()
    assert 'notifier_notifications_accepted_total{category="security"' in scrape
    assert "notifier_queue_depth" in scrape or "notifier_queue_messages" in scrape


@pytest.mark.django_db(transaction=True)
def test_worker_exports_accept_to_sent_latency_by_priority(api: Any, start_worker: Any, tmp_path: Any) -> None:
    """A sent high-priority delivery is observed in notifier_delivery_latency_seconds on the worker's port."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    template_put(key="otp", category="security", default_locale="en", content=CONTENT)
    recipient_upsert(user_id="u-lat", email="lat@example.com")
    port = free_port()  # a port of its own: parallel runs start workers at once
    # Prefork children write their samples to the multiprocess directory; the main process serves them.
    start_worker(env={"METRICS_WORKER_PORT": str(port), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    response = api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": "u-lat"}, "category": "security", "template": "otp", "payload": {"code": 3}},
        format="json",
    )
    delivery = response.json()["deliveries"][0]
    wait_for(lambda: Delivery.objects.filter(pk=delivery["id"], status="sent").exists())

    def observed() -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as scraped:
            text = scraped.read().decode()
        counts = {
            (s.labels.get("channel"), s.labels.get("priority")): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "notifier_delivery_latency_seconds_count"
        }
        return float(counts.get((delivery["channel"], "high"), 0))

    # The worker observes the latency after it commits the outcome: a scrape right after `sent` can precede it.
    wait_for(lambda: observed() >= 1, timeout=10)


@pytest.mark.django_db
def test_outbox_backlog_counts_deliveries_the_relay_must_publish(api: Any) -> None:
    """A queued delivery never published shows in notifier_outbox_backlog; a sent one does not."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.factories import make_delivery

    def backlog() -> float:
        text = api.get("/metrics").content.decode()
        return next(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "notifier_outbox_backlog"
        )

    before = backlog()
    make_delivery(status=Delivery.Status.SENT)
    make_delivery(status=Delivery.Status.QUEUED, published_at=None)
    assert backlog() == before + 1
