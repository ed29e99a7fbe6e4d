"""Routes of open and click tracking (mounted at /t/)."""

from __future__ import annotations

from django.urls import path

from notifier.tracking.views import click_view, open_view

urlpatterns = [
    path("c/<str:token>", click_view, name="tracking-click"),
    path("o/<str:token>.gif", open_view, name="tracking-open"),
]
