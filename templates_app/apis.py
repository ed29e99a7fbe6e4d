"""Templates over the API: create versions, read them, preview them (docs/api.md, "Templates")."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import ApiError
from core.pagination import CursorPage, cursor_id
from core.serializers import validate_with
from templates_app.layouts import render_all
from templates_app.rendering import RenderError
from templates_app.selectors import (
    LayoutNotFound,
    TemplateNotFound,
    layout_get,
    template_default_locale,
    template_get,
    template_list,
    template_version_get,
)
from templates_app.serializers import (
    LayoutOutputSerializer,
    LayoutPutInputSerializer,
    LayoutPutOutputSerializer,
    RollbackInputSerializer,
    TemplateListQuerySerializer,
    TemplateOutputSerializer,
    TemplatePage,
    TemplatePreviewInputSerializer,
    TemplatePreviewOutputSerializer,
    TemplatePutInputSerializer,
    TemplatePutOutputSerializer,
    VersionSerializer,
)
from templates_app.services import layout_put, layout_rollback, template_put, template_rollback

# A project that changes its live environment only by promotion refuses a live key's PUT.
PROMOTION_REQUIRED = {
    "put": {409: "`promotion_required`: the project changes its live environment only by promotion from test."}
}


def _not_found(exc: TemplateNotFound) -> ApiError:
    """Return the 404 for an unknown template or version."""
    return ApiError(404, "template_not_found", str(exc))


def _actor(request: Request) -> str:
    """Name the caller in a version's created_by."""
    return f"api:{getattr(request.user, 'name', '')}"


class TemplateListApi(APIView):
    """GET /templates: every template, oldest first, keyset-paginated."""

    required_scope = "templates"

    @extend_schema(
        operation_id="templates_list",
        summary="List templates",
        parameters=[TemplateListQuerySerializer],
        responses=TemplatePage,
    )
    def get(self, request: Request) -> Response:
        params = TemplateListQuerySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        limit = params.validated_data["limit"]
        rows = template_list(after_id=cursor_id(params.validated_data.get("cursor")) or 0, limit=limit + 1)
        page = rows[:limit]
        return Response(TemplatePage(CursorPage(page, page[-1].pk if len(rows) > limit else None)).data)


class TemplatePutApi(APIView):
    """PUT /templates/{key} creates a new version; GET /templates/{key} returns the template."""

    required_scope = "templates"
    error_statuses = PROMOTION_REQUIRED

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
            # Recorded as who made a new template; any key of the environment with `templates` may change it.
            client_id=request.user.pk,
            layout=data.get("layout") or "",
            enforce_promotion=True,
        )
        return Response(TemplatePutOutputSerializer(version).data, status=status.HTTP_201_CREATED)

    @extend_schema(operation_id="template_get", summary="Read a template", responses={200: TemplateOutputSerializer})
    def get(self, request: Request, key: str) -> Response:
        try:
            template = template_get(key=key)
        except TemplateNotFound as exc:
            raise _not_found(exc) from None
        return Response(TemplateOutputSerializer(template, context={"client_id": request.user.pk}).data)


class TemplateRollbackApi(APIView):
    """POST /templates/{key}/rollback: publish an earlier version again, as the template's next version."""

    required_scope = "templates"

    @extend_schema(
        operation_id="template_rollback",
        summary="Roll back to an earlier version",
        request=RollbackInputSerializer,
        responses={201: TemplatePutOutputSerializer},
    )
    def post(self, request: Request, key: str) -> Response:
        try:
            template_get(key=key)  # an unknown template is a 404 whatever the body
            data = validate_with(RollbackInputSerializer, request.data)
            version = template_rollback(
                key=key,
                version=data["version"],
                actor=_actor(request),
                audit_actor=request.user,
                client_id=request.user.pk,
                allowed_categories=getattr(request.user, "allowed_categories", None),
            )
        except TemplateNotFound as exc:
            raise _not_found(exc) from None
        return Response(TemplatePutOutputSerializer(version).data, status=status.HTTP_201_CREATED)


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
            if exc.code == "renderer_busy":  # every render child of this process is busy: come back shortly
                busy = ApiError(503, exc.code, exc.message)
                busy.wait = 1  # type: ignore[attr-defined]  # the error handler's Retry-After
                raise busy from None
            fields = {f"payload.{exc.variable}": [f"is required by {exc.path}"]} if exc.variable else {}
            raise ApiError(400, exc.code, exc.message, fields) from None
        preview = {"version": version, "locale": data["locale"], "rendered": rendered}
        return Response(TemplatePreviewOutputSerializer(preview).data)


class LayoutApi(APIView):
    """PUT /layouts/{key} creates a new version of an email layout; GET /layouts/{key} returns it."""

    required_scope = "templates"
    error_statuses = PROMOTION_REQUIRED

    @extend_schema(
        operation_id="layout_put",
        summary="Create an email layout version",
        request=LayoutPutInputSerializer,
        responses={201: LayoutPutOutputSerializer},
    )
    def put(self, request: Request, key: str) -> Response:
        serializer = LayoutPutInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        version = layout_put(
            key=key,
            html=data["html"],
            text=data["text"],
            actor=_actor(request),
            audit_actor=request.user,
            enforce_promotion=True,
        )
        return Response(LayoutPutOutputSerializer(version).data, status=status.HTTP_201_CREATED)

    @extend_schema(operation_id="layout_get", summary="Read an email layout", responses={200: LayoutOutputSerializer})
    def get(self, request: Request, key: str) -> Response:
        try:
            layout, versions = layout_get(key=key)
        except LayoutNotFound as exc:
            raise ApiError(404, "layout_not_found", str(exc)) from None
        current = versions[0]
        body = {
            "key": layout.key,
            "version": current.version,
            "html": current.html,
            "text": current.text,
            "created_at": layout.created_at,
            "updated_at": layout.updated_at,
            "versions": versions,
        }
        return Response(LayoutOutputSerializer(body).data)


class LayoutRollbackApi(APIView):
    """POST /layouts/{key}/rollback: make an earlier version the one in use again, as the layout's next version."""

    required_scope = "templates"

    @extend_schema(
        operation_id="layout_rollback",
        summary="Roll an email layout back to an earlier version",
        request=RollbackInputSerializer,
        responses={201: LayoutPutOutputSerializer},
    )
    def post(self, request: Request, key: str) -> Response:
        try:
            layout_get(key=key)  # an unknown layout is a 404 whatever the body
            data = validate_with(RollbackInputSerializer, request.data)
            version = layout_rollback(key=key, version=data["version"], actor=_actor(request), audit_actor=request.user)
        except LayoutNotFound as exc:
            raise ApiError(404, "layout_not_found", str(exc)) from None
        return Response(LayoutPutOutputSerializer(version).data, status=status.HTTP_201_CREATED)
