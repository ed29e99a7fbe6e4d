"""App configuration of the audit log."""

from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The audit log; imports no other app of the project, so every app may write to it."""

    name = "audit"
    verbose_name = "Audit log"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Copy the admin's log entries into the audit log (audit/admin_log.py)."""
        from django.contrib.admin.models import LogEntry
        from django.db.models.signals import post_save

        from audit.admin_log import record_admin_log_entry

        post_save.connect(record_admin_log_entry, sender=LogEntry, dispatch_uid="audit_admin_log_entry")
