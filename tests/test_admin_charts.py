"""The dashboard's and the campaigns' charts: server-side SVG from the event history, escaped, no script."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from notifier.charts import bar_chart, line_chart
from notifier.dashboard import BUCKET_MINUTES, outcome_series, provider_errors
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
