"""Workflow tasks (thin): advance runs by id, and the wake relay beat calls.

A database gone for a moment retries with backoff, as the fan-out does: a retried advance repeats nothing.
"""

from __future__ import annotations

from celery import shared_task

from core import task_names
from core.queues import INFRA_RETRY
from notifier.workflows.services import runs_advance, runs_wake


@shared_task(name=task_names.WORKFLOW_ADVANCE, **INFRA_RETRY)
def advance(run_ids: list[int]) -> dict[str, int]:
    """Advance these workflow runs to their next wait or their end."""
    return runs_advance(run_ids=run_ids)


@shared_task(name=task_names.WORKFLOW_WAKE)
def wake() -> int:
    """Publish the workflow runs that are due (their wait is over) or whose message was lost."""
    return runs_wake()
