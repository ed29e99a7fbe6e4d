"""Operations routes, mounted at the site root: /healthz, /readyz and /metrics (no API key)."""

from __future__ import annotations

from django.urls import path

from ops import health as ops

urlpatterns = [
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics_view, name="metrics"),
]
