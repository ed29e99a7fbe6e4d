"""Template routes, included by the project under /api/v1/."""

from __future__ import annotations

from django.urls import path

from templates_app.apis import (
    LayoutApi,
    LayoutRollbackApi,
    TemplateListApi,
    TemplatePreviewApi,
    TemplatePutApi,
    TemplateRollbackApi,
    TemplateVersionApi,
)

urlpatterns = [
    path("templates", TemplateListApi.as_view(), name="templates"),
    path("templates/<str:key>", TemplatePutApi.as_view(), name="template-detail"),
    path("templates/<str:key>/versions/<id:version>", TemplateVersionApi.as_view(), name="template-version"),
    path("templates/<str:key>/preview", TemplatePreviewApi.as_view(), name="template-preview"),
    path("templates/<str:key>/rollback", TemplateRollbackApi.as_view(), name="template-rollback"),
    path("layouts/<str:key>", LayoutApi.as_view(), name="layout-detail"),
    path("layouts/<str:key>/rollback", LayoutRollbackApi.as_view(), name="layout-rollback"),
]
