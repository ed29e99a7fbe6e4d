"""Routes of /api/v1/ (channels_app adds its own from config/urls.py: it sits above this app)."""

from __future__ import annotations

from django.urls import include, path

from notifier.accepting import apis

urlpatterns = [
    path("notifications", apis.NotificationListCreateApi.as_view(), name="notifications"),
    path("notifications/batch", apis.NotificationBatchApi.as_view(), name="notifications-batch"),
    path("notifications/<uuid:notification_id>", apis.NotificationDetailApi.as_view(), name="notification"),
    path(
        "notifications/<uuid:notification_id>/cancel", apis.NotificationCancelApi.as_view(), name="notification-cancel"
    ),
    path("stats", apis.StatsApi.as_view(), name="stats"),
    path("", include("templates_app.urls")),
    path("", include("preferences.urls")),
    path("", include("notifier.inbox.urls")),
    path("", include("notifier.deadletters.urls")),
    path("", include("notifier.campaigns.urls")),
    path("", include("notifier.statusevents.urls")),
    path("", include("notifier.workflows.urls")),
    path("", include("projects.urls")),
]
