"""Bodies and answers of the workflow endpoints."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from core.pagination import CursorQuerySerializer, cursor_page_serializer
from notifier.workflows.models import Workflow, WorkflowVersion


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
