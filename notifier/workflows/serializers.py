"""Bodies and answers of the workflow endpoints."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.errors import exception_handler
from core.openapi import ErrorDetailSerializer
from core.pagination import CursorQuerySerializer, cursor_page_serializer
from notifier.workflows.models import Workflow, WorkflowVersion
from notifier.workflows.services import PromotionResult


class WorkflowPutInput(serializers.Serializer):
    """The body of PUT /api/v1/workflows/{key}; the steps are checked by notifier.workflows.definitions."""

    category = serializers.CharField(max_length=64)
    steps = serializers.ListField(child=serializers.JSONField(), allow_empty=False, max_length=50)

    def validate_category(self, value: str) -> str:
        if value not in settings.NOTIFIER_CATEGORIES:
            known = ", ".join(sorted(settings.NOTIFIER_CATEGORIES))
            raise serializers.ValidationError(f"Unknown category. Configured categories: {known}.")
        return value


class WorkflowVersionOutput(serializers.Serializer):
    """One version of a workflow."""

    key = serializers.CharField(source="workflow.key")
    version = serializers.IntegerField()
    category = serializers.CharField()
    steps = serializers.ListField(child=serializers.JSONField())
    created_at = serializers.DateTimeField()


class WorkflowOutput(serializers.Serializer):
    """A workflow with its latest version's definition and its version numbers."""

    key = serializers.CharField()
    version = serializers.IntegerField(source="latest_version", help_text="The latest version.")
    latest_version = serializers.IntegerField()
    category = serializers.SerializerMethodField()
    steps = serializers.SerializerMethodField()
    versions = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def _latest(self, workflow: Workflow) -> WorkflowVersion | None:
        versions = getattr(workflow, "all_versions", None)
        if versions is None:
            versions = workflow.all_versions = list(workflow.versions.order_by("-version"))  # type: ignore[attr-defined]
        return versions[0] if versions else None

    def get_category(self, workflow: Workflow) -> str | None:
        latest = self._latest(workflow)
        return latest.category if latest else None

    def get_steps(self, workflow: Workflow) -> list[Any]:
        latest = self._latest(workflow)
        return list(latest.steps) if latest else []

    def get_versions(self, workflow: Workflow) -> list[int]:
        self._latest(workflow)
        return [v.version for v in workflow.all_versions]  # type: ignore[attr-defined]


class WorkflowListQuery(CursorQuerySerializer):
    """Query of GET /api/v1/workflows."""


WorkflowPage = cursor_page_serializer(WorkflowOutput, name="WorkflowPage")


KIND_HELP = "`layout`, `template` or `workflow`."


class PromotionCandidateOutput(serializers.Serializer):
    """A layout, template or workflow whose version in test differs from live's."""

    kind = serializers.CharField(help_text=KIND_HELP)
    key = serializers.CharField()
    test_version = serializers.IntegerField(
        help_text="The version test uses: a template's published version, a layout's or workflow's newest."
    )
    live_version = serializers.IntegerField(allow_null=True, help_text="The version live uses; null: live has none.")
    diff = serializers.CharField(
        help_text="Unified diff from live's version to test's, of their canonical JSON (keys sorted, indented)."
    )


class PromotionListOutput(serializers.Serializer):
    """What the project could promote from test to live."""

    results = PromotionCandidateOutput(many=True)


class PromotionItemInput(serializers.Serializer):
    """One thing to promote (documentation only: the service checks each item on its own)."""

    kind = serializers.CharField(help_text=KIND_HELP)
    key = serializers.CharField()


@extend_schema_field(PromotionItemInput(many=True))
class PromotionItemsField(serializers.ListField):
    """The items, passed through as they are: each is checked on its own, so a bad one fails alone."""


class PromotionInput(serializers.Serializer):
    """The body of POST /api/v1/promotion: what to promote from test to live."""

    items = PromotionItemsField(
        allow_empty=False,
        max_length=1000,
        help_text='Up to 1,000 objects `{"kind": "template", "key": "order_shipped"}`; kind: ' + KIND_HELP,
    )


class PromotionResultOutput(serializers.Serializer):
    """One item's result, in the item's place: live's new version, or the error this item alone would have had."""

    kind = serializers.CharField()
    key = serializers.CharField()
    status = serializers.IntegerField(
        help_text="200 promoted; 404 no such object in test; 400 malformed, unknown kind, nothing to promote or "
        "refused in live (a layout or template it names missing there); 403 a template the key may not change."
    )
    live_version = serializers.IntegerField(allow_null=True, help_text="Live's new version; null when not promoted.")
    error = ErrorDetailSerializer(required=False)

    def to_representation(self, instance: PromotionResult) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": instance.kind, "key": instance.key, "live_version": instance.live_version}
        if instance.error is None:
            return {**body, "status": 200}
        # Through the API's one exception handler: an item's error reads as a call's for it alone would.
        response = exception_handler(instance.error, {})
        assert response is not None
        return {**body, **response.data, "status": response.status_code}


class PromotionOutput(serializers.Serializer):
    """The answer to a promotion: one result per item, in order."""

    results = PromotionResultOutput(many=True)
