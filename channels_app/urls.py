"""Routes of /api/v1/ served by the channels app (included by config/urls.py)."""

from __future__ import annotations

from django.urls import path

from channels_app import apis

urlpatterns = [
    path("sandbox/messages", apis.SandboxMessageListApi.as_view(), name="sandbox-messages"),
]
