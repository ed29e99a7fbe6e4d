"""Template routes, included by the project under /api/v1/."""

from __future__ import annotations

from django.urls import path

from templates_app.apis import LayoutApi, TemplateListApi, TemplatePreviewApi, TemplatePutApi, TemplateVersionApi

urlpatterns = [
    path("templates", TemplateListApi.as_view(), name="templates"),
    path("templates/<str:key>", TemplatePutApi.as_view(), name="template-detail"),
    path("templates/<str:key>/versions/<id:version>", TemplateVersionApi.as_view(), name="template-version"),
    path("templates/<str:key>/preview", TemplatePreviewApi.as_view(), name="template-preview"),
    path("layouts/<str:key>", LayoutApi.as_view(), name="layout-detail"),
]
