"""Routes of the event endpoint, included under `/api/v1/`."""

from __future__ import annotations

from django.urls import path

from notifier.statusevents.apis import EventAttemptsApi, EventEndpointApi, EventEndpointRotateSecretApi

urlpatterns = [
    path("event-endpoint", EventEndpointApi.as_view(), name="event-endpoint"),
    path("event-endpoint/rotate-secret", EventEndpointRotateSecretApi.as_view(), name="event-endpoint-rotate"),
    path("event-endpoint/attempts", EventAttemptsApi.as_view(), name="event-endpoint-attempts"),
]
