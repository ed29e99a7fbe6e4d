"""URL routes: the versioned API, provider callbacks, operations endpoints, admin and API docs."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from ops.dashboard import dashboard_view

urlpatterns = [
    # Before admin.site.urls, whose catch-all would take it.
    path("admin/notifier/dashboard/", admin.site.admin_view(dashboard_view), name="notifier-dashboard"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(permission_classes=[], authentication_classes=[]), name="schema"),
    path(
        "api/docs/",
        SpectacularSwaggerView.as_view(url_name="schema", permission_classes=[], authentication_classes=[]),
        name="docs",
    ),
    path(
        "api/redoc/",
        SpectacularRedocView.as_view(
            url_name="schema",
            template_name="notifier/api_redoc.html",  # no web fonts from a CDN
            permission_classes=[],
            authentication_classes=[],
        ),
        name="redoc",
    ),
    path("api/v1/", include("notifier.urls")),
    path("api/v1/", include("channels_app.urls")),
    path("callbacks/", include("notifier.callbacks.urls")),
    path("t/", include("notifier.tracking.urls")),
    path("", include("ops.urls")),
    path("", include("preferences.unsubscribe_urls")),
    path("", include("preferences.center")),
    path("", include("notifier.inbox.browser_urls")),
]

# A URL that matches no route under /api/, /inbox/v1/ and /callbacks/ answers the API's JSON error body.
handler404 = "core.errors.not_found_view"
