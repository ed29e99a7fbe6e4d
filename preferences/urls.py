"""API routes of recipients, devices, preferences, topics and suppressions (included under /api/v1/)."""

from __future__ import annotations

from django.urls import path

from preferences import apis

# user_id and device tokens may contain anything but a slash; topic keys are slugs.
urlpatterns = [
    path("recipients", apis.RecipientListApi.as_view(), name="recipients"),
    path("recipients/batch", apis.RecipientBatchApi.as_view(), name="recipients-batch"),
    path("recipients/<str:user_id>", apis.RecipientApi.as_view(), name="recipient"),
    path("recipients/<str:user_id>/devices", apis.DeviceListApi.as_view(), name="recipient-devices"),
    path("recipients/<str:user_id>/devices/<str:token>", apis.DeviceDetailApi.as_view(), name="recipient-device"),
    path("recipients/<str:user_id>/preferences", apis.PreferencesApi.as_view(), name="recipient-preferences"),
    path(
        "recipients/<str:user_id>/preference-link", apis.PreferenceLinkApi.as_view(), name="recipient-preference-link"
    ),
    path("suppressions", apis.SuppressionListApi.as_view(), name="suppressions"),
    path("suppressions/<id:suppression_id>", apis.SuppressionDetailApi.as_view(), name="suppression"),
    path("topics", apis.TopicListApi.as_view(), name="topics"),
    path("topics/<slug:key>", apis.TopicApi.as_view(), name="topic"),
    path("topics/<slug:key>/subscribers", apis.TopicSubscribersApi.as_view(), name="topic-subscribers"),
    path("topics/<slug:key>/subscribers/<str:user_id>", apis.TopicSubscriberApi.as_view(), name="topic-subscriber"),
]
