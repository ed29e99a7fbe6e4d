"""Template context for the admin's pages: where the operations dashboard is, for whoever may open it."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

from notifier.staff.roles import may_see_dashboard


def ops_links(request: HttpRequest) -> dict[str, Any]:
    """Return `ops_dashboard_url` on admin pages for a user who may see the dashboard (nothing for anyone else)."""
    user = getattr(request, "user", None)
    if not request.path.startswith("/admin/") or user is None or not may_see_dashboard(user):
        return {}
    try:
        return {"ops_dashboard_url": reverse("notifier-dashboard")}
    except NoReverseMatch:  # a URL configuration without the dashboard (an admin mounted on its own)
        return {}
