"""The operators' admin page: recent outcomes per channel, queue depths, fair shares, dead letters and breakers.

Deliveries and provider errors are charted from the event history; queue depths, dead letters and breaker
states from the samples beat takes every minute (ops/series.py), all over the last 24 hours.

A superuser sees the installation. A staff member sees the counts of their projects only (those where they may
see the dashboard): deliveries, provider errors and pending dead letters of those projects' environments. The
broker's queue depths, its dead-letter queues and the sampled history of both count every project's messages,
so they are left out for members; the breakers' states are shown (a provider's health, not anyone's counts). The
fair shares of the throttled low queues (each project's broadcast backlog, wait for room, entitled share and what
it fed) and the templates' render cost are shown per project: a member sees their projects' rows.

Mounted by config/urls.py before admin.site.urls, wrapped in admin.site.admin_view (staff only):
    path("admin/notifier/dashboard/", admin.site.admin_view(dashboard_view), name="notifier-dashboard"),
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from core.charts import COLOURS, bar_chart, line_chart, state_strip
from notifier.deliveries.models import DeliveryEvent
from notifier.deliveries.selectors import event_counts_by_bucket
from notifier.dispatch import shares
from notifier.staff.roles import DASHBOARD_PERMISSION, may_see_dashboard
from ops.collectors import collect_fair_shares, collect_pending_dead_letters, collect_queue_depths
from ops.series import breaker_series, breaker_states, number_series, ops_samples, total_series
from projects.admin import member_project_ids
from projects.models import Environment, Project

WINDOW = timedelta(hours=1)
OUTCOMES = ("sent", "delivered", "failed", "bounced", "suppressed", "deferred")


def _of(events: QuerySet[DeliveryEvent], environments: list[int] | None) -> QuerySet[DeliveryEvent]:
    """Narrow delivery events to the deliveries of `environments` (None: all)."""
    return events if environments is None else events.filter(delivery__environment_id__in=environments)


def channel_outcomes(since: Any, environments: list[int] | None = None) -> list[dict[str, Any]]:
    """Count status transitions per channel since `since` (from the event history; BRIN on its time)."""
    rows = (
        _of(DeliveryEvent.objects.filter(at__gte=since, status__in=OUTCOMES), environments)
        .values("delivery__channel", "status")
        .annotate(n=Count("id"))
        .order_by()
    )
    table: dict[str, dict[str, int]] = {channel: dict.fromkeys(OUTCOMES, 0) for channel in settings.CHANNELS}
    for row in rows:
        table.setdefault(row["delivery__channel"], dict.fromkeys(OUTCOMES, 0))[row["status"]] = row["n"]
    return [{"channel": channel, **counts} for channel, counts in table.items()]


CHART_WINDOW = timedelta(hours=24)
BUCKET_MINUTES = 5


def bucket_starts(since: Any, now: Any) -> list[Any]:
    """Return the starts of the 5-minute buckets from `since` to `now` (288 a day keep an SVG small)."""
    start = since.replace(second=0, microsecond=0)
    start -= timedelta(minutes=start.minute % BUCKET_MINUTES)
    count = int((now - start).total_seconds() // (BUCKET_MINUTES * 60)) + 1
    return [start + timedelta(minutes=BUCKET_MINUTES * i) for i in range(count)]


def outcome_series(
    since: Any, now: Any, environments: list[int] | None = None
) -> tuple[list[Any], dict[str, dict[str, list[float]]]]:
    """Return bucket starts and, per channel and outcome, deliveries per minute (averaged per 5-minute bucket).

    One grouped query over the event history (BRIN on its time); `environments`: only theirs (None: all).
    """
    labels = bucket_starts(since, now)
    count = len(labels)
    rows = event_counts_by_bucket(
        labels[0], "channel", OUTCOMES, bucket_seconds=BUCKET_MINUTES * 60, environment_ids=environments
    )
    series: dict[str, dict[str, list[float]]] = {
        channel: {status: [0.0] * count for status in OUTCOMES} for channel in settings.CHANNELS
    }
    for bucket, channel, status, n in rows:
        if 0 <= bucket < count:
            series.setdefault(channel, {s: [0.0] * count for s in OUTCOMES})[status][bucket] = n / BUCKET_MINUTES
    return labels, series


def provider_errors(since: datetime, environments: list[int] | None = None) -> dict[str, int]:
    """Count failed and bounced outcomes per provider since `since` (of `environments` only, if given)."""
    rows = (
        _of(DeliveryEvent.objects.filter(at__gte=since, status__in=("failed", "bounced")), environments)
        .values("delivery__provider")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {row["delivery__provider"] or "(none)": row["n"] for row in rows}


def provider_error_series(labels: list[Any], environments: list[int] | None = None) -> dict[str, list[float]]:
    """Return failed and bounced outcomes per provider and 5-minute bucket over the buckets `labels`."""
    series: dict[str, list[float]] = {}
    for bucket, provider, _, n in event_counts_by_bucket(
        labels[0],
        "provider",
        ("failed", "bounced"),
        bucket_seconds=BUCKET_MINUTES * 60,
        environment_ids=environments,
    ):
        if 0 <= bucket < len(labels):
            series.setdefault(provider or "(none)", [0.0] * len(labels))[bucket] += n
    return dict(sorted(series.items()))


# The queue chart's legend has room for the total and a few queues: the busiest by their peak.
TOP_QUEUES = 5


def history_charts(labels: list[Any], environments: list[int] | None = None) -> dict[str, Any]:
    """Draw queue depths, dead letters and breaker states over the sampled day, and provider errors.

    For a member (`environments` given): provider errors of their environments and the breakers only; the
    sampled queues and dead letters are the installation's.
    """
    samples = ops_samples(since=labels[0])
    errors = provider_error_series(labels, environments)
    error_history = line_chart(
        errors or {"errors": [0.0] * len(labels)},
        labels=labels,
        title="Provider errors per 5 minutes, last 24 hours",
        width=470,
    )
    breaker_history = state_strip(
        breaker_series(samples, labels), labels=labels, title="Circuit breakers, last 24 hours"
    )
    if environments is not None:
        return {"samples": len(samples), "error_history": error_history, "breaker_history": breaker_history}
    queues = number_series(samples, labels, "queues")
    busiest = sorted(queues, key=lambda q: max((v or 0 for v in queues[q]), default=0), reverse=True)
    shown = {"all queues": total_series(samples, labels, "queues")}
    shown |= {q: queues[q] for q in busiest[:TOP_QUEUES] if max((v or 0 for v in queues[q]), default=0) > 0}
    dead = {
        "pending (database)": total_series(samples, labels, "dead_pending"),
        "in dead-letter queues": total_series(samples, labels, "dead_queues"),
    }
    return {
        "samples": len(samples),
        "queue_history": line_chart(
            shown, labels=labels, title="Queue depth (ready messages), last 24 hours", width=470
        ),
        "dead_history": line_chart(dead, labels=labels, title="Dead letters, last 24 hours", width=470),
        "error_history": error_history,
        "breaker_history": breaker_history,
    }


def dashboard_charts(context: dict[str, Any]) -> dict[str, Any]:
    """Draw the dashboard's charts as server-side SVG (core/charts.py): no script, no CDN."""
    environments = context["environments"]
    now = timezone.now()
    labels, series = outcome_series(now - CHART_WINDOW, now, environments)
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
        **history_charts(labels, environments),
        "queues": bar_chart(queues, title="Queue depth now (ready messages)", width=420),
        "dead": bar_chart(
            dead,
            title="Dead letters now (pending, and in dead queues)" if environments is None else "Dead letters now",
            width=420,
        ),
        "provider_errors": bar_chart(
            provider_errors(now - CHART_WINDOW, environments), title="Provider errors, 24 hours"
        ),
        "breakers": bar_chart(
            {f"{b['provider']} ({b['state']})": 1 for b in context["breakers"]},
            title="Circuit breakers now",
            show_values=False,
            colours={f"{p} ({b['state']})": breaker_colours[p] for b in context["breakers"] for p in [b["provider"]]},
        ),
    }


def fair_share_rows(environments: list[int] | None) -> dict[str, Any]:
    """Return the throttled queues' shares per project and the templates' render costs (of `environments` only)."""
    states = collect_fair_shares()
    costs = shares.render_costs()
    scope = None if environments is None else set(environments)
    environment_rows = Environment.objects.filter(pk__in={e for e, _ in costs}).values_list(
        "pk", "project_id", "project__slug", "name"
    )
    env_names = {pk: (slug, name) for pk, _, slug, name in environment_rows}
    projects = None
    if scope is not None:
        projects = set(Environment.objects.filter(pk__in=scope).values_list("project_id", flat=True))
    visible = [s for s in states or [] if projects is None or s.project in projects]
    slugs = dict(Project.objects.filter(pk__in={s.project for s in visible}).values_list("pk", "slug"))
    return {
        "fair_up": states is not None,
        "fair_shares": [
            {
                "queue": s.queue,
                "project": slugs.get(s.project, str(s.project)),
                "backlog": s.backlog,
                "waiting": round(s.waiting_seconds, 1),
                "share": round(s.share * 100),
                "fed": s.fed,
            }
            for s in sorted(visible, key=lambda s: (s.queue, slugs.get(s.project, "")))
        ],
        "render_costs": [
            {
                "project": env_names.get(environment_id, (str(environment_id), ""))[0],
                "environment": env_names.get(environment_id, ("", ""))[1],
                "template": template,
                "milliseconds": round(seconds * 1000, 1),
            }
            for (environment_id, template), seconds in sorted(costs.items(), key=lambda item: -item[1])
            if scope is None or environment_id in scope
        ],
    }


def dashboard_context(environments: list[int] | None = None) -> dict[str, Any]:
    """Gather everything the dashboard shows: the installation's, or only `environments`' counts (a member's)."""
    since = timezone.now() - WINDOW
    # The broker's queues hold every project's messages: counted for superusers only.
    depths = collect_queue_depths() if environments is None else {}
    queues: list[dict[str, Any]] = [
        {"name": name, "messages": messages, "consumers": consumers}
        for name, (messages, consumers) in sorted((depths or {}).items())
    ]
    pending = collect_pending_dead_letters(environments)
    return {
        "environments": environments,
        "installation": environments is None,
        "since": since,
        "outcomes": channel_outcomes(since, environments),
        "outcome_names": OUTCOMES,
        "broker_up": depths is not None,
        "work_queues": [q for q in queues if not q["name"].startswith("dead.")],
        "dead_queues": [q for q in queues if q["name"].startswith("dead.")],
        "dead_letters_pending": sorted((pending or {}).items()),
        "dead_letters_total": sum((pending or {}).values()),
        "breakers": breaker_states(),
        **fair_share_rows(environments),
    }


def dashboard_view_context(environments: list[int] | None = None) -> dict[str, Any]:
    """Return the dashboard's tables and its charts (of `environments` only, if given)."""
    context = dashboard_context(environments)
    context["charts"] = dashboard_charts(context)
    return context


def dashboard_view(request: HttpRequest) -> HttpResponse:
    """Render the operations dashboard inside the admin's layout (403 for a role that may not see it)."""
    if not may_see_dashboard(request.user):
        raise PermissionDenied
    # A member sees the projects where their role may see the dashboard; a superuser the installation.
    projects = member_project_ids(request.user, DASHBOARD_PERMISSION)
    environments = None
    if projects is not None:
        environments = list(Environment.objects.filter(project_id__in=projects).values_list("id", flat=True))
    context = {
        **admin.site.each_context(request),
        "title": "Operations dashboard",
        "projects": [] if projects is None else list(Project.objects.filter(pk__in=projects).order_by("slug")),
        **dashboard_view_context(environments),
    }
    return TemplateResponse(request, "admin/ops/dashboard.html", context)
