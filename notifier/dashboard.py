"""The operators' admin page: recent outcomes per channel, queue depths, dead letters and breaker states.

Mounted by config/urls.py before admin.site.urls, wrapped in admin.site.admin_view (staff only):
    path("admin/notifier/dashboard/", admin.site.admin_view(dashboard_view), name="notifier-dashboard"),
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.db import connection
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from notifier.charts import COLOURS, bar_chart, line_chart
from notifier.metrics import collect_pending_dead_letters, collect_queue_depths
from notifier.models import DeliveryEvent

logger = logging.getLogger(__name__)

WINDOW = timedelta(hours=1)
OUTCOMES = ("sent", "delivered", "failed", "bounced", "suppressed", "deferred")


def channel_outcomes(since: Any) -> list[dict[str, Any]]:
    """Count status transitions per channel since `since` (from the event history; BRIN on its time)."""
    rows = (
        DeliveryEvent.objects.filter(at__gte=since, status__in=OUTCOMES)
        .values("delivery__channel", "status")
        .annotate(n=Count("id"))
        .order_by()
    )
    table: dict[str, dict[str, int]] = {channel: dict.fromkeys(OUTCOMES, 0) for channel in settings.CHANNELS}
    for row in rows:
        table.setdefault(row["delivery__channel"], dict.fromkeys(OUTCOMES, 0))[row["status"]] = row["n"]
    return [{"channel": channel, **counts} for channel, counts in table.items()]


def breaker_states() -> list[dict[str, str]]:
    """Return the circuit-breaker state of every configured provider, or "n/a" without the breaker module."""
    providers = sorted({p for names in settings.CHANNEL_PROVIDERS.values() for p in names})
    try:
        from channels_app.breaker import state
    except ImportError:
        return [{"provider": p, "state": "n/a"} for p in providers]
    result = []
    for provider in providers:
        try:
            value = state(provider)
        except Exception:
            logger.warning("breaker state unavailable", extra={"provider": provider})
            value = "n/a"
        result.append({"provider": provider, "state": value})
    return result


CHART_WINDOW = timedelta(hours=24)
BUCKET_MINUTES = 5


def outcome_series(since: datetime, now: datetime) -> tuple[list[datetime], dict[str, dict[str, list[float]]]]:
    """Return bucket starts and, per channel and outcome, deliveries per minute (averaged per 5-minute bucket).

    One grouped query over the event history (BRIN on its time); 288 points a day keep the SVG small.
    """
    start = since.replace(second=0, microsecond=0)
    start -= timedelta(minutes=start.minute % BUCKET_MINUTES)
    count = int((now - start).total_seconds() // (BUCKET_MINUTES * 60)) + 1
    labels = [start + timedelta(minutes=BUCKET_MINUTES * i) for i in range(count)]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT floor(extract(epoch FROM e.at - %s) / %s)::int AS bucket, d.channel, e.status, count(*)"
            " FROM notifier_deliveryevent e JOIN notifier_delivery d ON d.id = e.delivery_id"
            " WHERE e.at >= %s AND e.status = ANY(%s) GROUP BY 1, 2, 3",
            [start, BUCKET_MINUTES * 60, start, list(OUTCOMES)],
        )
        rows = cursor.fetchall()
    series: dict[str, dict[str, list[float]]] = {
        channel: {status: [0.0] * count for status in OUTCOMES} for channel in settings.CHANNELS
    }
    for bucket, channel, status, n in rows:
        if 0 <= bucket < count:
            series.setdefault(channel, {s: [0.0] * count for s in OUTCOMES})[status][bucket] = n / BUCKET_MINUTES
    return labels, series


def provider_errors(since: datetime) -> dict[str, int]:
    """Count failed and bounced outcomes per provider since `since`."""
    rows = (
        DeliveryEvent.objects.filter(at__gte=since, status__in=("failed", "bounced"))
        .values("delivery__provider")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {row["delivery__provider"] or "(none)": row["n"] for row in rows}


def dashboard_charts(context: dict[str, Any]) -> dict[str, Any]:
    """Draw the dashboard's charts as server-side SVG (notifier/charts.py): no script, no CDN."""
    now = timezone.now()
    labels, series = outcome_series(now - CHART_WINDOW, now)
    per_channel = [
        {
            "channel": channel,
            "svg": line_chart(
                {status: values for status, values in by_status.items() if any(values)} or {"sent": [0] * len(labels)},
                labels=labels,
                title=f"{channel}: deliveries per minute, last 24 hours",
                width=470,
            ),
        }
        for channel, by_status in series.items()
    ]
    queues = {q["name"]: q["messages"] for q in context["work_queues"]}
    dead = dict(context["dead_letters_pending"]) | {q["name"]: q["messages"] for q in context["dead_queues"]}
    breaker_colours = {b["provider"]: COLOURS.get(b["state"], "#999999") for b in context["breakers"]}
    return {
        "per_channel": per_channel,
        "queues": bar_chart(queues, title="Queue depth (ready messages)", width=420),
        "dead": bar_chart(dead, title="Dead letters (pending, and in dead queues)", width=420),
        "provider_errors": bar_chart(provider_errors(now - CHART_WINDOW), title="Provider errors, 24 hours"),
        "breakers": bar_chart(
            {f"{b['provider']} ({b['state']})": 1 for b in context["breakers"]},
            title="Circuit breakers",
            show_values=False,
            colours={f"{p} ({b['state']})": breaker_colours[p] for b in context["breakers"] for p in [b["provider"]]},
        ),
    }


def dashboard_context() -> dict[str, Any]:
    """Gather everything the dashboard shows."""
    since = timezone.now() - WINDOW
    depths = collect_queue_depths()
    queues: list[dict[str, Any]] = [
        {"name": name, "messages": messages, "consumers": consumers}
        for name, (messages, consumers) in sorted((depths or {}).items())
    ]
    pending = collect_pending_dead_letters()
    return {
        "since": since,
        "outcomes": channel_outcomes(since),
        "outcome_names": OUTCOMES,
        "broker_up": depths is not None,
        "work_queues": [q for q in queues if not q["name"].startswith("dead.")],
        "dead_queues": [q for q in queues if q["name"].startswith("dead.")],
        "dead_letters_pending": sorted((pending or {}).items()),
        "dead_letters_total": sum((pending or {}).values()),
        "breakers": breaker_states(),
    }


def dashboard_view_context() -> dict[str, Any]:
    """Return the dashboard's tables and its charts."""
    context = dashboard_context()
    context["charts"] = dashboard_charts(context)
    return context


def dashboard_view(request: HttpRequest) -> HttpResponse:
    """Render the operations dashboard inside the admin's layout."""
    context = {
        **admin.site.each_context(request),
        "title": "Operations dashboard",
        **dashboard_view_context(),
    }
    return TemplateResponse(request, "admin/notifier/dashboard.html", context)
