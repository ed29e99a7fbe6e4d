"""App configuration of the audit log."""

from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The audit log; imports no other app of the project, so every app may write to it."""

    name = "audit"
    verbose_name = "Audit log"
    default_auto_field = "django.db.models.BigAutoField"
