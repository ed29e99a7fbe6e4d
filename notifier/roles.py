"""The staff roles: which permissions the "Support" and "Marketing" groups hold (least privilege).

The data migration 0006_staff_roles creates the groups from these lists, and `manage.py create_staff_user`
puts a new staff user in one. Support reads deliveries, resends, cancels, manages suppressions, edits and
previews templates; publishing a template takes `templates_app.publish_template`, which Support does not
hold unless an administrator grants it. Marketing runs campaigns and topics and edits (and publishes) only
templates of optional categories (`templates_app.edit_optional_templates_only` narrows what it sees).
"""

from __future__ import annotations

SUPPORT = "Support"
MARKETING = "Marketing"

ROLE_PERMISSIONS: dict[str, list[str]] = {
    SUPPORT: [
        "notifier.view_delivery",
        "notifier.resend_delivery",
        "notifier.cancel_delivery",
        "notifier.view_notification",
        "notifier.view_deadletter",
        "preferences.view_recipient",
        "preferences.view_suppression",
        "preferences.add_suppression",
        "preferences.delete_suppression",
        "templates_app.view_template",
        "templates_app.add_template",
        "templates_app.change_template",
        "templates_app.view_templateversion",
        "channels_app.view_sandboxmessage",
    ],
    MARKETING: [
        "notifier.view_campaign",
        "notifier.add_campaign",
        "notifier.change_campaign",
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
