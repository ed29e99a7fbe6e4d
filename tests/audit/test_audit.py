"""The audit log: entries masked, actors told apart, read-only in the admin."""

from __future__ import annotations

import pytest
from django.test import Client

from audit.models import AuditEntry
from audit.services import Actor, audit_record, diff
from notifier.clients.services import api_client_create
from tests.factories import make_staff_user

pytestmark = pytest.mark.django_db


def test_entry_masks_personal_data_and_names_the_client() -> None:
    client, _ = api_client_create(name="billing")
    entry = audit_record(
        actor=client,
        action="recipient.update",
        target_type="recipient",
        target_id="u-42",
        changes=diff({"email": "old@example.com", "locale": "en"}, {"email": "new@example.com", "locale": "en"}),
    )
    entry.refresh_from_db()
    assert (entry.actor_type, entry.actor_name, entry.actor_id) == ("client", "billing", str(client.pk))
    assert list(entry.changes) == ["email"]  # unchanged fields are not recorded
    stored = str(entry.changes)
    assert "old@example.com" not in stored and "new@example.com" not in stored


def test_staff_user_and_explicit_actor() -> None:
    user = make_staff_user("support-1", password="x")
    assert audit_record(actor=user, action="suppression.delete", target_type="suppression").actor_type == "staff"
    entry = audit_record(actor=Actor("recipient", "u-1", "u-1"), action="preferences.update", target_type="recipient")
    assert (entry.actor_type, entry.actor_name) == ("recipient", "u-1")
    assert AuditEntry.objects.count() == 2


def test_admin_lists_entries_read_only(admin_client: Client) -> None:
    audit_record(actor=None, action="template.publish", target_type="template", target_id="order_shipped")
    page = admin_client.get("/admin/audit/auditentry/")
    assert page.status_code == 200 and b"template.publish" in page.content
    assert admin_client.get("/admin/audit/auditentry/add/").status_code == 403
