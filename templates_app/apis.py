"""Templates over the API: create versions, read them, preview them (API.md "Templates")."""

from __future__ import annotations

from typing import Any, cast

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from notifier.errors import ApiError
from templates_app.models import Template, TemplateVersion
from templates_app.rendering import RenderError, render_all
from templates_app.selectors import (
    TemplateNotFound,
    template_default_locale,
    template_get,
    template_version_get,
    template_version_list,
)
from templates_app.services import template_put
from templates_app.sms import sms_preview


def _not_found(exc: TemplateNotFound) -> ApiError:
    """Return the 404 for an unknown template or version."""
    return ApiError(404, "template_not_found", str(exc))


def _actor(request: Request) -> str:
    """Name the caller in a version's created_by."""
    return f"api:{getattr(request.user, 'name', '')}"


class VersionSummarySerializer(serializers.Serializer):
    """A version without its content."""

    version = serializers.IntegerField()
    published = serializers.SerializerMethodField()
    published_at = serializers.DateTimeField(allow_null=True)
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()

    def get_published(self, obj: TemplateVersion) -> bool:
        """Say whether this is the template's current published version."""
        return obj.pk == obj.template.published_version_id


class VersionSerializer(VersionSummarySerializer):
    """A version with its content and the channels it serves."""

    channels = serializers.ListField(child=serializers.CharField())
    content = serializers.JSONField()


class TemplatePutApi(APIView):
    """PUT /templates/{key} creates a new version; GET /templates/{key} returns the template."""

    required_scope = "templates"

    class TemplatePutInputSerializer(serializers.Serializer):
        category = serializers.CharField(max_length=64)
        default_locale = serializers.CharField(max_length=35, required=False)
        publish = serializers.BooleanField(default=True)
        content = serializers.DictField()

    class TemplatePutOutputSerializer(serializers.Serializer):
        key = serializers.CharField()
        version = serializers.IntegerField()
        published = serializers.BooleanField()

    class TemplateOutputSerializer(serializers.Serializer):
        key = serializers.CharField()
        category = serializers.CharField()
        default_locale = serializers.CharField()
        description = serializers.CharField()
        created_at = serializers.DateTimeField()
        updated_at = serializers.DateTimeField()
        published_version = serializers.SerializerMethodField()
        published = serializers.SerializerMethodField()
        versions = serializers.SerializerMethodField()

        def get_published_version(self, obj: Template) -> int | None:
            return obj.published_version.version if obj.published_version else None

        def get_published(self, obj: Template) -> dict[str, Any] | None:
            if obj.published_version is None:
                return None
            obj.published_version.template = obj
            return VersionSerializer(obj.published_version).data

        def get_versions(self, obj: Template) -> list[dict[str, Any]]:
            versions = list(template_version_list(template=obj).defer("content"))
            for version in versions:
                version.template = obj
            return cast(list[dict[str, Any]], VersionSummarySerializer(versions, many=True).data)  # a ReturnList

    @extend_schema(request=TemplatePutInputSerializer, responses={201: TemplatePutOutputSerializer})
    def put(self, request: Request, key: str) -> Response:
        serializer = self.TemplatePutInputSerializer(data=request.data)
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
        body = {"key": version.template.key, "version": version.version, "published": version.published_at is not None}
        return Response(self.TemplatePutOutputSerializer(body).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: TemplateOutputSerializer})
    def get(self, request: Request, key: str) -> Response:
        try:
            template = template_get(key=key)
        except TemplateNotFound as exc:
            raise _not_found(exc) from None
        return Response(self.TemplateOutputSerializer(template).data)


class TemplateVersionApi(APIView):
    """GET /templates/{key}/versions/{version}: one version with its content (drafts included)."""

    required_scope = "templates"

    @extend_schema(responses={200: VersionSerializer})
    def get(self, request: Request, key: str, version: int) -> Response:
        try:
            found = template_version_get(key=key, version=version)
        except TemplateNotFound as exc:
            raise _not_found(exc) from None
        return Response(VersionSerializer(found).data)


class TemplatePreviewApi(APIView):
    """POST /templates/{key}/preview: render every channel of a version with a sample payload."""

    required_scope = "templates"

    class TemplatePreviewInputSerializer(serializers.Serializer):
        payload = serializers.DictField(default=dict)
        locale = serializers.CharField(max_length=35, required=False, allow_blank=True, default="")
        version = serializers.IntegerField(min_value=1, required=False)

    class TemplatePreviewOutputSerializer(serializers.Serializer):
        key = serializers.CharField()
        version = serializers.IntegerField()
        published = serializers.BooleanField()
        locale = serializers.CharField(allow_blank=True)
        channels = serializers.DictField()

    @extend_schema(request=TemplatePreviewInputSerializer, responses={200: TemplatePreviewOutputSerializer})
    def post(self, request: Request, key: str) -> Response:
        serializer = self.TemplatePreviewInputSerializer(data=request.data)
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
        body = {
            "key": version.template.key,
            "version": version.version,
            "published": version.pk == version.template.published_version_id,
            "locale": data["locale"],
            "channels": {channel: {"locale": r.locale, "parts": r.parts} for channel, r in rendered.items()},
        }
        if "sms" in rendered:
            body["channels"]["sms"]["sms"] = sms_preview(str(rendered["sms"].parts.get("text") or ""))
        return Response(self.TemplatePreviewOutputSerializer(body).data)
