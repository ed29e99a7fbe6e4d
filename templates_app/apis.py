"""Templates over the API: create versions, read them, preview them (API.md "Templates")."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import ApiError
from templates_app.rendering import RenderError, render_all
from templates_app.selectors import (
    TemplateNotFound,
    template_default_locale,
    template_get,
    template_version_get,
)
from templates_app.serializers import (
    TemplateOutputSerializer,
    TemplatePreviewInputSerializer,
    TemplatePreviewOutputSerializer,
    TemplatePutInputSerializer,
    TemplatePutOutputSerializer,
    VersionSerializer,
)
from templates_app.services import template_put


def _not_found(exc: TemplateNotFound) -> ApiError:
    """Return the 404 for an unknown template or version."""
    return ApiError(404, "template_not_found", str(exc))


def _actor(request: Request) -> str:
    """Name the caller in a version's created_by."""
    return f"api:{getattr(request.user, 'name', '')}"


class TemplatePutApi(APIView):
    """PUT /templates/{key} creates a new version; GET /templates/{key} returns the template."""

    required_scope = "templates"

    @extend_schema(
        operation_id="template_put",
        summary="Create a template version",
        request=TemplatePutInputSerializer,
        responses={201: TemplatePutOutputSerializer},
    )
    def put(self, request: Request, key: str) -> Response:
        serializer = TemplatePutInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        version = template_put(
            key=key,
            category=data["category"],
            default_locale=data.get("default_locale") or template_default_locale(key=key),
            content=data["content"],
            publish=data["publish"],
            actor=_actor(request),
            allowed_categories=getattr(request.user, "allowed_categories", None),
            audit_actor=request.user,
        )
        return Response(TemplatePutOutputSerializer(version).data, status=status.HTTP_201_CREATED)

    @extend_schema(operation_id="template_get", summary="Read a template", responses={200: TemplateOutputSerializer})
    def get(self, request: Request, key: str) -> Response:
        try:
            template = template_get(key=key)
        except TemplateNotFound as exc:
            raise _not_found(exc) from None
        return Response(TemplateOutputSerializer(template).data)


class TemplateVersionApi(APIView):
    """GET /templates/{key}/versions/{version}: one version with its content (drafts included)."""

    required_scope = "templates"

    @extend_schema(operation_id="template_version_get", summary="Read one version", responses={200: VersionSerializer})
    def get(self, request: Request, key: str, version: int) -> Response:
        try:
            found = template_version_get(key=key, version=version)
        except TemplateNotFound as exc:
            raise _not_found(exc) from None
        return Response(VersionSerializer(found).data)


class TemplatePreviewApi(APIView):
    """POST /templates/{key}/preview: render every channel of a version with a sample payload."""

    required_scope = "templates"

    @extend_schema(
        operation_id="template_preview",
        summary="Preview a version",
        request=TemplatePreviewInputSerializer,
        responses={200: TemplatePreviewOutputSerializer},
    )
    def post(self, request: Request, key: str) -> Response:
        serializer = TemplatePreviewInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            version = template_version_get(key=key, version=data.get("version"))
        except TemplateNotFound as exc:
            raise _not_found(exc) from None
        try:
            rendered = render_all(version, locale=data["locale"], payload=data["payload"])
        except RenderError as exc:
            fields = {f"payload.{exc.variable}": [f"is required by {exc.path}"]} if exc.variable else {}
            raise ApiError(400, exc.code, exc.message, fields) from None
        preview = {"version": version, "locale": data["locale"], "rendered": rendered}
        return Response(TemplatePreviewOutputSerializer(preview).data)
