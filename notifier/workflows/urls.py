"""Routes of /api/v1/workflows."""

from __future__ import annotations

from django.urls import path

from notifier.workflows import apis

urlpatterns = [
    path("workflows", apis.WorkflowListApi.as_view(), name="workflows"),
    path("workflows/<slug:key>", apis.WorkflowApi.as_view(), name="workflow"),
    path("workflows/<slug:key>/rollback", apis.WorkflowRollbackApi.as_view(), name="workflow-rollback"),
    path("promotion", apis.PromotionApi.as_view(), name="promotion"),
]
