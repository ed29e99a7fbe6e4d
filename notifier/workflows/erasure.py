"""Forget an erased recipient in what workflows keep: their runs, the digests they collected, their steps' reasons.

Connected to preferences.signals.recipient_erased by WorkflowsConfig.ready(). The rows stay (a run's steps and
statuses are its history, a notification's answer reads them); their personal data goes:

- runs of the recipient: `user_id` becomes the recipient's stand-in (`erased:<id>`, as on the recipient row)
  and `digest` (the merged triggers' payloads) is emptied. A run still running or waiting ends `cancelled`:
  the payloads its next steps would render are gone (the triggering notification's is emptied by
  notifier/deliveries/erasure.py), and what is left of the recipient has no address to send to;
- digest groups the recipient's runs led: `events` (each trigger's payload) emptied, `key` (rendered from a
  payload) blanked, closed;
- steps of those runs: `reason`, which quotes payload values (a condition's value, a digest's key, a delay's
  unreadable time), replaced by ERASED_REASON. The step's status stays.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from notifier.workflows.models import WorkflowDigest, WorkflowRun, WorkflowStep
from notifier.workflows.services import LIVE
from preferences.models import Recipient

ERASED_REASON = "erased with the recipient's personal data"
CANCELLED_REASON = "cancelled: recipient erased"


def workflows_forget_recipient(*, recipient: Recipient, at: datetime, **_signal: Any) -> None:
    """Forget the workflow runs of `recipient`: user_id, digests and step reasons; end the live ones."""
    runs = WorkflowRun.objects.filter(recipient_id=recipient.pk)  # workflow_run_recipient_idx
    # Waits for a run being advanced right now (its row lock), as a cancel does: it is then finished or cancelled.
    live = list(runs.select_for_update(of=("self",)).filter(status__in=LIVE).values_list("pk", flat=True))
    steps = WorkflowStep.objects.filter(run__recipient_id=recipient.pk)
    steps.update(reason=ERASED_REASON)
    if live:
        WorkflowRun.objects.filter(pk__in=live).update(status=WorkflowRun.Status.CANCELLED, wake_at=None)
        steps.filter(run_id__in=live, status=WorkflowStep.Status.WAITING).update(
            status=WorkflowStep.Status.CANCELLED, reason=CANCELLED_REASON, at=at
        )
    # Through the leader's index: every group is led by a run of the recipient it collects for.
    WorkflowDigest.objects.filter(leader__recipient_id=recipient.pk).update(events=[], key="", closed=True)
    runs.update(user_id=recipient.user_id, digest=None, updated_at=at)
