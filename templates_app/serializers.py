"""Input and output serializers of the templates API (docs/api.md, "Templates")."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.pagination import CursorQuerySerializer, cursor_page_serializer
from core.serializers import JsonObjectField
from templates_app.models import Template, TemplateVersion
from templates_app.selectors import template_version_list
from templates_app.sms import sms_preview


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
    layout = serializers.CharField(help_text="The email layout this version names; empty: the category's default.")


class TemplatePutInputSerializer(serializers.Serializer):
    """The body of PUT /api/v1/templates/{key}: every PUT creates a new version."""

    category = serializers.CharField(max_length=64)
    default_locale = serializers.CharField(max_length=35, required=False)
    publish = serializers.BooleanField(default=True, help_text="False keeps the new version as a draft.")
    content = JsonObjectField(help_text="Per locale, per channel: the parts of the message (docs/api.md, Templates).")
    layout = serializers.CharField(
        max_length=128,
        required=False,
        allow_blank=True,
        allow_null=True,
        default="",
        help_text="Key of the email layout the HTML is placed in; empty: the category's default layout, if any.",
    )


class RollbackInputSerializer(serializers.Serializer):
    """The body of POST /api/v1/templates|layouts|workflows/{key}/rollback."""

    version = serializers.IntegerField(
        min_value=1,
        # The column's range: a larger number names no version, and PostgreSQL refuses to compare with it.
        max_value=2_147_483_647,
        help_text="The earlier version to use again; it is published again as the next version.",
    )


class TemplatePutOutputSerializer(serializers.Serializer):
    """The version a PUT created."""

    key = serializers.CharField(source="template.key")
    version = serializers.IntegerField()
    published = serializers.SerializerMethodField()

    def get_published(self, obj: TemplateVersion) -> bool:
        return obj.published_at is not None


class TemplateOutputSerializer(serializers.Serializer):
    """A template with its published version and the summary of every version."""

    key = serializers.CharField()
    category = serializers.CharField()
    default_locale = serializers.CharField()
    description = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    published_version = serializers.SerializerMethodField()
    published = serializers.SerializerMethodField()
    versions = serializers.SerializerMethodField()
    owner = serializers.SerializerMethodField(
        help_text="Who made it: `you` (the calling client), `another_client` (another key of this project "
        "environment) or `staff` (made in the admin or by a command). Information only: every key of the "
        "environment with the `templates` scope changes and publishes any of its templates."
    )

    def get_owner(self, obj: Template) -> str:
        if obj.owner_client_id is None:
            return "staff"
        return "you" if obj.owner_client_id == self.context.get("client_id") else "another_client"

    def get_published_version(self, obj: Template) -> int | None:
        return obj.published_version.version if obj.published_version else None

    @extend_schema_field(VersionSerializer(allow_null=True))
    def get_published(self, obj: Template) -> dict[str, Any] | None:
        if obj.published_version is None:
            return None
        obj.published_version.template = obj
        return VersionSerializer(obj.published_version).data

    @extend_schema_field(VersionSummarySerializer(many=True))
    def get_versions(self, obj: Template) -> list[dict[str, Any]]:
        versions = list(template_version_list(template=obj).defer("content"))
        for version in versions:
            version.template = obj
        return VersionSummarySerializer(versions, many=True).data  # type: ignore[return-value]  # many=True gives a ListSerializer: .data is a list, the stubs say a dict


class TemplateListQuerySerializer(CursorQuerySerializer):
    """Query parameters of the template list: the cursor and the page size."""


class TemplateListItemSerializer(serializers.Serializer):
    """A template as the list shows it (`GET /templates/{key}` adds its versions)."""

    key = serializers.CharField()
    category = serializers.CharField()
    default_locale = serializers.CharField()
    description = serializers.CharField()
    published_version = serializers.IntegerField(
        source="published_version.version", allow_null=True, help_text="Null while the template has only drafts."
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


TemplatePage = cursor_page_serializer(TemplateListItemSerializer, name="TemplatePage")


class TemplatePreviewInputSerializer(serializers.Serializer):
    """The body of POST /api/v1/templates/{key}/preview."""

    payload = JsonObjectField(default=dict, help_text="Template variables.")
    locale = serializers.CharField(max_length=35, required=False, allow_blank=True, default="")
    version = serializers.IntegerField(min_value=1, required=False, help_text="Default: the published version.")


class PreviewChannelSerializer(serializers.Serializer):
    """One channel's rendering: the locale used and the parts; SMS adds its encoding and segments."""

    locale = serializers.CharField()
    parts = serializers.DictField()
    sms = serializers.SerializerMethodField(required=False, help_text="SMS only: encoding, segments and length.")

    def get_sms(self, rendered: Any) -> dict[str, Any]:
        return sms_preview(str(rendered.parts.get("text") or ""))

    def to_representation(self, instance: Any) -> dict[str, Any]:
        body = super().to_representation(instance)
        if self.context.get("channel") != "sms":
            del body["sms"]
        return body


class TemplatePreviewOutputSerializer(serializers.Serializer):
    """Every channel of a version rendered with a sample payload (given a dict of version, locale, rendered)."""

    key = serializers.CharField(source="version.template.key")
    version = serializers.IntegerField(source="version.version")
    published = serializers.SerializerMethodField()
    locale = serializers.CharField(allow_blank=True)
    channels = serializers.SerializerMethodField()

    def get_published(self, preview: dict[str, Any]) -> bool:
        return preview["version"].pk == preview["version"].template.published_version_id

    @extend_schema_field(serializers.DictField(child=PreviewChannelSerializer()))
    def get_channels(self, preview: dict[str, Any]) -> dict[str, Any]:
        return {
            channel: PreviewChannelSerializer(rendered, context={"channel": channel}).data
            for channel, rendered in preview["rendered"].items()
        }


class LayoutPutInputSerializer(serializers.Serializer):
    """The body of PUT /api/v1/layouts/{key}: every PUT creates a new version, which is the one used."""

    html = serializers.CharField(trim_whitespace=False, help_text="HTML with {{ content }} where the message goes.")
    text = serializers.CharField(
        trim_whitespace=False,
        required=False,
        allow_blank=True,
        default="",
        help_text="Text with {{ content }}; empty: the text part is the message's own (or derived from its HTML).",
    )


class LayoutPutOutputSerializer(serializers.Serializer):
    """The layout version a PUT created."""

    key = serializers.CharField(source="layout.key")
    version = serializers.IntegerField()


class LayoutVersionSummarySerializer(serializers.Serializer):
    """A layout version without its content."""

    version = serializers.IntegerField()
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()


class LayoutOutputSerializer(serializers.Serializer):
    """A layout: its current (newest) version's content and the summary of every version."""

    key = serializers.CharField()
    version = serializers.IntegerField()
    html = serializers.CharField()
    text = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    versions = LayoutVersionSummarySerializer(many=True)
