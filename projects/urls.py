"""Routes of the project endpoint under /api/v1/."""

from __future__ import annotations

from django.urls import path

from projects import apis

urlpatterns = [
    path("project", apis.ProjectApi.as_view(), name="project"),
]
