"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    """Configure the workflows app."""

    name = "notifier.workflows"
    label = "workflows"
    verbose_name = "Workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: the fan-out and the notifications API sit below this app and cannot import it; they
        # call what registers here.
        from notifier.accepting.send_kinds import SendKind, send_kind_register
        from notifier.dispatch import fanout
        from notifier.workflows.erasure import workflows_forget_recipient
        from notifier.workflows.selectors import notification_workflow
        from notifier.workflows.services import STRATEGY, runs_cancel, runs_create_for_page, workflow_trigger
        from preferences.signals import recipient_erased

        fanout.register_page_writer(STRATEGY, runs_create_for_page)
        recipient_erased.connect(workflows_forget_recipient, dispatch_uid="notifier.workflows.erasure")
        send_kind_register(
            SendKind(
                field="workflow",
                strategy=STRATEGY,
                accept=workflow_trigger,
                describe=notification_workflow,
                cancel=lambda notification: runs_cancel(notification=notification),
            )
        )
