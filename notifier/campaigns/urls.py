"""Routes of the campaigns API (included under /api/v1/)."""

from __future__ import annotations

from django.urls import path

from notifier.campaigns import apis

urlpatterns = [
    path("campaigns", apis.CampaignListCreateApi.as_view(), name="campaigns"),
    path("campaigns/<id:campaign_id>", apis.CampaignDetailApi.as_view(), name="campaign"),
    path(
        "campaigns/<id:campaign_id>/<str:action>",
        apis.CampaignActionApi.as_view(),
        name="campaign-action",
    ),
]
