"""The staff roles: which permissions the "Support" and "Marketing" groups hold (least privilege).

The data migration 0006_staff_roles creates the groups from these lists, and `manage.py create_staff_user`
puts a new staff user in one. Support reads deliveries and workflow runs, resends, cancels, manages
suppressions, edits and previews templates; publishing a template takes `templates_app.publish_template`,
which Support does not hold unless an administrator grants it. Marketing runs campaigns (pausing, resuming
and cancelling one takes `campaigns.pause_campaign`, `campaigns.resume_campaign` and `campaigns.cancel_campaign`)
and topics and edits (and publishes) only templates of optional categories
(`templates_app.edit_optional_templates_only` narrows what it sees).
"""

from __future__ import annotations

from typing import Any

SUPPORT = "Support"
MARKETING = "Marketing"

ROLE_PERMISSIONS: dict[str, list[str]] = {
    SUPPORT: [
        "deliveries.view_delivery",
        "deliveries.resend_delivery",
        "deliveries.cancel_delivery",
        "deliveries.view_notification",
        "deadletters.view_deadletter",
        "preferences.view_recipient",
        "preferences.view_suppression",
        "preferences.add_suppression",
        "preferences.delete_suppression",
        "templates_app.view_template",
        "templates_app.add_template",
        "templates_app.change_template",
        "templates_app.view_templateversion",
        "channels_app.view_sandboxmessage",
        # Why did this user get two emails: a workflow's runs and every step's reason.
        "workflows.view_workflow",
        "workflows.view_workflowversion",
        "workflows.view_workflowrun",
        "workflows.view_workflowstep",
    ],
    MARKETING: [
        "campaigns.view_campaign",
        "campaigns.add_campaign",
        "campaigns.change_campaign",
        "campaigns.pause_campaign",
        "campaigns.resume_campaign",
        "campaigns.cancel_campaign",
        "preferences.view_topic",
        "preferences.add_topic",
        "preferences.change_topic",
        "preferences.view_subscription",
        "templates_app.view_template",
        "templates_app.add_template",
        "templates_app.change_template",
        "templates_app.view_templateversion",
        "templates_app.publish_template",
        "templates_app.edit_optional_templates_only",
    ],
}
ROLES = {"support": SUPPORT, "marketing": MARKETING}

# The operations dashboard (ops/dashboard.py) shows queue depths, dead letters and breaker states: it is for whoever
# may read dead letters (Support, and superusers), not for Marketing.
DASHBOARD_PERMISSION = "deadletters.view_deadletter"


def may_see_dashboard(user: Any) -> bool:
    """Return whether a user may open the operations dashboard (and so sees it linked in the admin)."""
    return bool(getattr(user, "is_active", False) and user.is_staff and user.has_perm(DASHBOARD_PERMISSION))
