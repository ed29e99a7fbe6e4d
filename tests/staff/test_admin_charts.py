"""The dashboard's and the campaigns' charts: server-side SVG from the event history, escaped, no script."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from core.charts import bar_chart, line_chart, state_strip
from notifier.deadletters.models import DeadLetter
from ops.dashboard import BUCKET_MINUTES, bucket_starts, outcome_series, provider_error_series, provider_errors
from ops.series import breaker_series, number_series, ops_sample, ops_samples, total_series
from tests.conftest import purge_all_queues, queue_depth, wait_for
from tests.factories import make_delivery, make_delivery_event, make_staff_user

pytestmark = pytest.mark.django_db


def test_outcome_series_counts_per_channel_status_and_bucket() -> None:
    now = timezone.now()
    email = make_delivery(channel="email", status="sent", provider="ses")
    sms = make_delivery(channel="sms", status="failed", provider="twilio")
    for _ in range(10):
        make_delivery_event(delivery=email, status="sent", at=now - timedelta(minutes=1))
    make_delivery_event(delivery=sms, status="failed", at=now - timedelta(hours=3))
    make_delivery_event(delivery=sms, status="failed", at=now - timedelta(hours=30))  # outside the window
    labels, series = outcome_series(now - timedelta(hours=24), now)
    assert len(labels) == 24 * 60 // BUCKET_MINUTES + 1
    assert sum(series["email"]["sent"]) == 10 / BUCKET_MINUTES
    assert max(series["email"]["sent"]) == 10 / BUCKET_MINUTES  # one bucket, as a per-minute rate
    assert sum(series["sms"]["failed"]) == 1 / BUCKET_MINUTES
    assert provider_errors(now - timedelta(hours=24)) == {"twilio": 1}
    errors = provider_error_series(labels)
    assert list(errors) == ["twilio"] and sum(errors["twilio"]) == 1  # per provider and bucket


def test_charts_are_svg_with_escaped_labels_and_scaled_points() -> None:
    now = timezone.now()
    labels = [now + timedelta(minutes=i) for i in range(3)]
    svg = str(line_chart({"<b>sent</b>": [0, 5, 10]}, labels=labels, title="a & b"))
    assert svg.startswith("<svg") and "<script" not in svg
    assert "&lt;b&gt;sent&lt;/b&gt;" in svg and "a &amp; b" in svg
    points = re.search(r'points="([^"]+)"', svg).group(1).split()
    ys = [float(p.split(",")[1]) for p in points]
    assert ys[0] > ys[1] > ys[2]  # higher values are drawn higher
    bars = str(bar_chart({"sms.high": 40, "email.high": 10}, title="Queues"))
    widths = [float(w) for w in re.findall(r'<rect x="\d+" y="[\d.]+" width="([\d.]+)"', bars)]
    assert widths[0] == pytest.approx(4 * widths[1])


def test_the_dashboard_page_draws_its_charts(client: Client) -> None:
    delivery = make_delivery(channel="push", status="sent")
    make_delivery_event(delivery=delivery, status="sent", at=timezone.now())
    client.force_login(make_staff_user("ops", superuser=True))
    html = client.get("/admin/notifier/dashboard/").content.decode()
    assert html.count('class="channel-chart"') >= 5
    assert "push: deliveries per minute, last 24 hours" in html
    assert "Queue depth" in html and "Dead letters" in html and "Provider errors" in html
    assert "Circuit breakers" in html
    assert "cdn" not in html.lower()


def test_verbose_names_in_the_admin_index(client: Client) -> None:
    client.force_login(make_staff_user("ops", superuser=True))
    html = client.get("/admin/").content.decode()
    assert "Deliveries" in html and "Deliverys" not in html
    assert ">Templates<" in html and "Templates_App" not in html and "Templates_app" not in html


def test_the_sampler_records_queues_dead_letters_and_breakers_and_keeps_a_day() -> None:
    from channels_app.breaker import record, state
    from config.celery import app as celery_app

    purge_all_queues()
    now = timezone.now()
    assert ops_sample(now=now - timedelta(hours=25)) is not None  # beyond the day kept: trimmed by the next
    first = ops_sample(now=now - timedelta(minutes=10))
    # Then three messages wait in a queue nobody consumes here, a delivery is dead and a provider fails.
    for _ in range(3):
        celery_app.send_task("notifier.tasks.noop", queue="email.low")
    wait_for(lambda: queue_depth("email.low") == 3)
    DeadLetter.objects.create(delivery=make_delivery(channel="sms"), channel="sms", queue="sms.high", reason="x")
    record("sandbox", ok=False, n=200)
    assert state("sandbox") == "open"
    try:
        second = ops_sample(now=now)
    finally:
        purge_all_queues()
    assert first is not None and second is not None  # ops_sample stores a sample while Redis is up

    samples = ops_samples(since=now - timedelta(days=2))
    assert [s["t"] for s in samples] == [first["t"], second["t"]]
    assert samples[0]["queues"]["email.low"] == 0 and samples[1]["queues"]["email.low"] == 3
    assert samples[0]["dead_pending"] == {} and samples[1]["dead_pending"] == {"sms": 1}
    assert (samples[0]["breakers"]["sandbox"], samples[1]["breakers"]["sandbox"]) == ("closed", "open")
    assert all(not name.startswith("dead.") for name in samples[1]["queues"])
    assert samples[1]["dead_queues"] and all(name.startswith("dead.") for name in samples[1]["dead_queues"])

    labels = bucket_starts(now - timedelta(hours=24), now)
    queues = number_series(samples, labels, "queues")
    assert [v for v in queues["email.low"] if v is not None] == [0.0, 3.0]  # two buckets; the others are gaps
    assert queues["email.low"][0] is None
    total = total_series(samples, labels, "queues")
    assert [v for v in total if v is not None] == [0.0, 3.0]
    assert [v for v in total_series(samples, labels, "dead_pending") if v is not None] == [0.0, 1.0]
    assert [v for v in number_series(samples, labels, "dead_pending")["sms"] if v is not None] == [1.0]
    assert [s for s in breaker_series(samples, labels)["sandbox"] if s] == ["closed", "open"]


def test_gaps_break_the_line_and_states_are_drawn_as_strips() -> None:
    now = timezone.now()
    labels = [now + timedelta(minutes=i) for i in range(6)]
    svg = str(line_chart({"depth": [1, 2, None, None, 4, None]}, labels=labels, title="q"))
    assert svg.count("<polyline") == 1 and len(re.search(r'points="([^"]+)"', svg).group(1).split()) == 2
    assert svg.count("<circle") == 1  # the lone point after the gap
    strip = str(state_strip({"ses": [None, "closed", "open"]}, labels=labels[:3], title="Breakers"))
    assert re.findall(r'data-state="(\w+)"', strip) == ["closed", "open"]
