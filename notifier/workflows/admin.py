"""Admin of workflows: versions (promoted to live, rolled back), and runs with every step's reason on one page."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from notifier.workflows.models import Workflow, WorkflowRun, WorkflowStep, WorkflowVersion
from notifier.workflows.selectors import run_steps, workflows_in_use
from notifier.workflows.services import workflow_promote, workflow_rollback
from projects.admin import OwnedAdmin, PromotionAdmin, version_rollback_link
from projects.promotion import Reader
from projects.scoping import owner_id, owner_scope


class WorkflowVersionInline(admin.TabularInline):
    """The versions of a workflow (immutable: a new one comes with each save over the API), each but the latest
    with a roll-back link."""

    model = WorkflowVersion
    extra = 0
    fields = ("version", "category", "definition", "created_by", "created_at", "rollback")
    readonly_fields = fields
    can_delete = False
    ordering = ("-version",)

    @admin.display(description="steps")
    def definition(self, obj: WorkflowVersion) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.steps, indent=2))

    @admin.display(description="")
    def rollback(self, obj: WorkflowVersion) -> str:
        return version_rollback_link(obj.workflow, obj.version, current=obj.workflow.latest_version) if obj.pk else ""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Workflow)
class WorkflowAdmin(PromotionAdmin):
    """Workflows with their versions; their runs are one click away.

    A workflow of a test environment is promoted to live from its page; any environment's workflow rolls back to
    an earlier version from its versions (as its next version).
    """

    list_display = ["key", "latest_version", "updated_at", "runs"]
    search_fields = ["key"]
    readonly_fields = ["key", "latest_version", "promotion", "created_at", "updated_at"]
    inlines = [WorkflowVersionInline]
    promotion_kind = "workflow"

    def promotion_reader(self) -> Reader:
        return workflows_in_use

    def promotion_run(self, request: HttpRequest, obj: Workflow) -> int:
        version = workflow_promote(
            key=obj.key,
            environment_id=owner_id(obj),
            actor=f"admin:{request.user.get_username()}",
            audit_actor=request.user,
        )
        return version.version

    def rollback_versions(self, obj: Workflow) -> tuple[dict[int, dict[str, Any]], int | None]:
        versions = {v.version: {"category": v.category, "steps": v.steps} for v in obj.versions.all()}
        return versions, obj.latest_version or None

    def rollback_run(self, request: HttpRequest, obj: Workflow, version: int) -> int:
        with owner_scope(owner_id(obj)):
            made = workflow_rollback(
                key=obj.key, version=version, actor=f"admin:{request.user.get_username()}", audit_actor=request.user
            )
        return made.version

    @admin.display(description="runs")
    def runs(self, obj: Workflow) -> str:
        return format_html('<a href="../workflowrun/?version__workflow__key={}">runs</a>', obj.key)


class WorkflowStepInline(admin.TabularInline):
    """The steps a run reached, each with why."""

    model = WorkflowStep
    extra = 0
    fields = ("index", "step_id", "type", "status", "reason", "notification_id", "at")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WorkflowRun)
class WorkflowRunAdmin(OwnedAdmin):
    """Runs per recipient: support answers "why did this user get two emails" from one page."""

    list_display = ["id", "user_id", "workflow", "status", "step_index", "wake_at", "created_at"]
    list_filter = ["status", "version__workflow__key"]
    search_fields = ["user_id", "=notification_id"]
    readonly_fields = ["notification_id", "version", "user_id", "recipient_id", "priority", "status", "step_index",
                       "wake_at", "published_at", "digest", "created_at", "updated_at", "every_step"]  # fmt: skip
    exclude = ["client_id"]
    inlines = [WorkflowStepInline]

    @admin.display(description="workflow")
    def workflow(self, obj: WorkflowRun) -> str:
        return str(obj.version)

    @admin.display(description="every step (and why)")
    def every_step(self, obj: WorkflowRun) -> str:
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (s["id"], s["type"], s["status"], s["reason"],
                 ", ".join(f"{d['channel']} {d['status']}" for d in s.get("deliveries", [])))
                for s in run_steps(obj)
            ),
        )  # fmt: skip
        return format_html(
            "<table><tr><th>step</th><th>type</th><th>status</th><th>reason</th><th>deliveries</th></tr>{}</table>",
            rows,
        )

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("version__workflow")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
