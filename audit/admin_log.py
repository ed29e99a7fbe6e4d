"""Every add, change and delete made through the Django admin goes into the audit log as well.

Django writes an admin LogEntry for each; this copies it (who, what, which object, the change message), so
the audit log answers "who changed this in the admin" for every model admin, including those that do not
audit their own writes. Actions with their own meaning (publish, resend, suppress) are audited where they
happen, under their own action names; admins with AuditedAdminMixin record their own field-level entries
and are skipped here.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry

from audit.admin import AuditedAdminMixin
from audit.services import audit_record

FLAGS = {ADDITION: "add", CHANGE: "change", DELETION: "delete"}


def record_admin_log_entry(sender: Any, instance: LogEntry, created: bool, **kwargs: Any) -> None:
    """Append the audit entry of one admin log entry (post_save receiver, connected in AuditConfig.ready)."""
    if not created:
        return
    content_type = instance.content_type
    model = content_type.model_class() if content_type else None
    if model is not None and isinstance(admin.site._registry.get(model), AuditedAdminMixin):
        return  # that admin audits its own writes, field by field

    target_type = f"{content_type.app_label}.{content_type.model}" if content_type else "unknown"
    audit_record(
        actor=instance.user,
        action=f"admin.{FLAGS.get(instance.action_flag, 'other')}",
        target_type=target_type,
        target_id=instance.object_id or "",
        changes={"object": [None, instance.object_repr], "message": [None, instance.get_change_message()]},
    )
