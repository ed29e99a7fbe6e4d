"""Celery tasks of recipients: the admin's imports, run on the maintenance queue."""

from __future__ import annotations

import io
import logging

from celery import current_app, shared_task

from audit.services import Actor
from core import task_names
from core.queues import INFRA_RETRY
from preferences.imports import import_run
from preferences.models import RecipientImport
from projects.scoping import owner_scope

logger = logging.getLogger(__name__)


@shared_task(name=task_names.IMPORT_RECIPIENTS, ignore_result=True, **INFRA_RETRY)
def import_recipients(import_id: int) -> None:
    """Run (or resume, if a worker died in it) an import uploaded in the admin, a chunk per transaction."""
    job = RecipientImport.objects.filter(pk=import_id).first()
    if job is None or job.status == RecipientImport.Status.DONE:
        return
    with owner_scope(job.environment_id):
        job = import_run(job, io.StringIO(job.content, newline=""), audit_actor=Actor("staff", name=job.created_by))
    logger.info("recipient import %s done: %s created, %s updated, %s refused", job.pk, job.created, job.updated,
                job.refused)  # fmt: skip


def import_enqueue(job: RecipientImport) -> None:
    """Queue an import for the maintenance workers."""
    RecipientImport.objects.filter(pk=job.pk).update(status=RecipientImport.Status.QUEUED)
    current_app.send_task(task_names.IMPORT_RECIPIENTS, args=[job.pk], queue="maintenance")
