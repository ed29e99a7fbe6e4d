"""The operators' admin page: recent outcomes per channel, queue depths, dead letters and breaker states.

Mounted by config/urls.py before admin.site.urls, wrapped in admin.site.admin_view (staff only):
    path("admin/notifier/dashboard/", admin.site.admin_view(dashboard_view), name="notifier-dashboard"),
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

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


def dashboard_context() -> dict[str, Any]:
    """Gather everything the dashboard shows."""
    since = timezone.now() - WINDOW
    depths = collect_queue_depths()
    queues = [
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


def dashboard_view(request: HttpRequest) -> HttpResponse:
    """Render the operations dashboard inside the admin's layout."""
    context = {
        **admin.site.each_context(request),
        "title": "Operations dashboard",
        **dashboard_context(),
    }
    return TemplateResponse(request, "admin/notifier/dashboard.html", context)
