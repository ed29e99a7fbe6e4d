"""Reads of workflows: definitions and versions, and a notification's workflow with its steps and their reasons."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db.models import Count, F

from notifier.deliveries.models import Notification
from notifier.deliveries.selectors import deliveries_of_notifications
from notifier.workflows.models import Workflow, WorkflowRun, WorkflowStep, WorkflowTrigger, WorkflowVersion
from projects.promotion import Candidate, InUse, Reader, promotion_candidates
from templates_app.selectors import layouts_in_use, templates_in_use


class WorkflowNotFound(Exception):
    """No workflow (or no such version of it) matches a spec."""


def workflow_version_resolve(spec: str) -> WorkflowVersion:
    """Return the version a trigger uses: "key" → the latest, "key@3" → version 3; raise WorkflowNotFound."""
    key, sep, number = (spec or "").strip().partition("@")
    if sep and (not number.isdigit() or int(number) < 1):
        raise WorkflowNotFound(f"workflow '{spec}': the version after '@' must be a positive integer")
    workflow = Workflow.objects.filter(key=key).first()
    if workflow is None or workflow.latest_version == 0:
        raise WorkflowNotFound(f"unknown workflow '{key}'")
    wanted = int(number) if sep else workflow.latest_version
    version = WorkflowVersion.objects.filter(workflow=workflow, version=wanted).first()
    if version is None:
        raise WorkflowNotFound(f"workflow '{key}' has no version {wanted}")
    version.workflow = workflow
    return version


def workflow_get(*, key: str) -> Workflow | None:
    """Return the workflow with `key` (its versions newest first in `.all_versions`), or None."""
    workflow = Workflow.objects.filter(key=key).first()
    if workflow is not None:
        workflow.all_versions = list(workflow.versions.order_by("-version"))  # type: ignore[attr-defined]
    return workflow


def workflow_list(*, after_id: int = 0, limit: int = 50) -> list[Workflow]:
    """Return up to `limit` workflows with id > `after_id`, in id order (keyset page)."""
    return list(Workflow.objects.filter(pk__gt=after_id).order_by("pk")[:limit])


def workflow_version_latest(workflow: Workflow) -> WorkflowVersion | None:
    """Return a workflow's newest version."""
    return workflow.versions.order_by("-version").first()


def workflows_in_use(keys: Sequence[str] | None = None) -> dict[str, InUse]:
    """Return, by key, the latest version of the scope's workflows (all, or those of `keys`): the one sends run."""
    versions = WorkflowVersion.objects.filter(version=F("workflow__latest_version")).select_related("workflow")
    if keys is not None:
        versions = versions.filter(workflow__key__in=keys)
    return {
        v.workflow.key: InUse(version=v.version, content={"category": v.category, "steps": v.steps}) for v in versions
    }


def workflow_exists(key: str) -> bool:
    """Say whether the scope's environment has a workflow `key`."""
    return Workflow.objects.filter(key=key).exists()


# Every kind that promotion carries from test to live, in the order it writes them: what a template names (its
# layout) first, and a workflow (which names templates) last, so that one promotion can carry all three.
PROMOTION_READERS: dict[str, Reader] = {
    "layout": layouts_in_use,
    "template": templates_in_use,
    "workflow": workflows_in_use,
}


def promotion_list(*, environment_id: int) -> list[Candidate]:
    """Return every layout, template and workflow of the project whose version in test differs from live's."""
    return promotion_candidates(environment_id=environment_id, readers=PROMOTION_READERS)


def run_steps(run: WorkflowRun, *, with_deliveries: bool = True) -> list[dict[str, Any]]:
    """Return every step of a run's version with its status, reason and time (`pending` when not reached).

    Steps after the one a run ended on (merged, throttled, failed, cancelled) read `skipped` or `cancelled`
    with the run's end as their reason. A send step lists the deliveries it created.
    """
    rows = {s.index: s for s in WorkflowStep.objects.filter(run=run)}
    deliveries = (
        deliveries_of_notifications(notification_ids=[s.notification_id for s in rows.values() if s.notification_id])
        if with_deliveries
        else {}
    )
    out: list[dict[str, Any]] = []
    for index, step in enumerate(run.version.steps):
        row = rows.get(index)
        item: dict[str, Any] = {"id": step["id"], "type": step["type"]}
        if row is not None:
            item.update(status=row.status, reason=row.reason, at=row.at)
        elif run.status == WorkflowRun.Status.CANCELLED:
            item.update(status="cancelled", reason="run cancelled", at=None)
        elif run.status in (WorkflowRun.Status.MERGED, WorkflowRun.Status.THROTTLED, WorkflowRun.Status.FAILED):
            item.update(status="skipped", reason=f"run ended {run.status}", at=None)
        else:
            item.update(status="pending", reason="", at=None)
        if step["type"] == "send":
            found = deliveries.get(row.notification_id, []) if row is not None and row.notification_id else []
            item["notification_id"] = str(row.notification_id) if row is not None and row.notification_id else None
            item["deliveries"] = [
                {"id": d.pk, "channel": d.channel, "status": d.status, "reason": d.reason} for d in found
            ]
        out.append(item)
    return out


def notification_workflow(notification: Notification) -> dict[str, Any] | None:
    """Return `workflow`, `workflow_version`, and for a user `run_status` and `steps`, of a triggering notification."""
    trigger = (
        WorkflowTrigger.objects.filter(notification_id=notification.pk).select_related("version__workflow").first()
    )
    if trigger is None:
        return None
    answer: dict[str, Any] = {"workflow": trigger.version.workflow.key, "workflow_version": trigger.version.version}
    if notification.topic_id:
        runs = WorkflowRun.objects.filter(notification_id=notification.pk)
        answer["runs"] = {r["status"]: r["n"] for r in _count_by_status(runs)}
        return answer
    run = WorkflowRun.objects.filter(notification_id=notification.pk).select_related("version").first()
    if run is not None:
        answer["run_status"] = run.status
        answer["steps"] = run_steps(run)
    return answer


def _count_by_status(runs: Any) -> list[dict[str, Any]]:
    return list(runs.values("status").annotate(n=Count("id")).order_by())


def runs_of_notification(notification_id: uuid.UUID) -> list[WorkflowRun]:
    """Return the runs a notification started (one for a user, one per subscriber for a topic)."""
    return list(WorkflowRun.objects.filter(notification_id=notification_id).order_by("id"))
