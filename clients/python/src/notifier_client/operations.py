"""Which client method calls each operation of the server's OpenAPI schema (by operationId).

One table for both clients: `Notifier` and `AsyncNotifier` have a method of the same name for each entry (the
async one awaited, or an async iterator for lists). A list operation maps to the iterator that follows its
`next_cursor`. The tests compare this table with the schema the server generates and fail on an operation
missing here: a new endpoint gets its row (and its two methods) in the same change.

Operations mapped to None are not for calling services, with the reason in NOT_FOR_CLIENTS.
"""

from __future__ import annotations

OPERATIONS: dict[str, str | None] = {
    # Notifications
    "notifications_send": "send",
    "notifications_send_batch": "send_batch",
    "notifications_list": "notifications",
    "notification_get": "get",
    "notification_cancel": "cancel",
    # Recipients, devices, preferences
    "recipients_list": "recipients",
    "recipient_put": "put_recipient",
    "recipients_batch": "put_recipients",
    "recipient_get": "get_recipient",
    "recipient_erase": "delete_recipient",
    "recipient_device_add": "add_device",
    "recipient_device_remove": "remove_device",
    "preferences_get": "get_preferences",
    "preferences_put": "set_preferences",
    "preference_link_create": "create_preference_link",
    # The in-app inbox, with the API key and (browser_*) with an inbox token
    "inbox_list": "inbox",
    "inbox_item_read": "mark_inbox_read",
    "inbox_read_all": "mark_inbox_all_read",
    "inbox_item_archive": "archive_inbox_item",
    "inbox_item_unarchive": "unarchive_inbox_item",
    "inbox_item_click": "click_inbox_item",
    "inbox_token_create": "create_inbox_token",
    "browser_inbox_list": "browser_inbox",
    "browser_inbox_item_read": "browser_mark_read",
    "browser_inbox_read_all": "browser_mark_all_read",
    "browser_inbox_item_archive": "browser_archive",
    "browser_inbox_item_unarchive": "browser_unarchive",
    "browser_inbox_item_click": "browser_click",
    "browser_inbox_me": "browser_me",
    # Topics
    "topics_list": "topics",
    "topic_put": "put_topic",
    "topic_get": "get_topic",
    "topic_subscribe": "subscribe",
    "topic_unsubscribe": "unsubscribe",
    # Suppressions
    "suppressions_list": "suppressions",
    "suppression_add": "add_suppression",
    "suppression_remove": "remove_suppression",
    # Templates and email layouts
    "templates_list": "templates",
    "template_put": "put_template",
    "template_get": "get_template",
    "template_version_get": "get_template_version",
    "template_preview": "preview_template",
    "template_rollback": "rollback_template",
    "layout_put": "put_layout",
    "layout_get": "get_layout",
    "layout_rollback": "rollback_layout",
    # Workflows
    "workflows_list": "workflows",
    "workflow_put": "put_workflow",
    "workflow_get": "get_workflow",
    "workflow_rollback": "rollback_workflow",
    # The key's project
    "project_get": "get_project",
    # Promotion from test to live
    "promotion_list": "promotions",
    "promotion_apply": "promote",
    # Campaigns
    "campaigns_list": "campaigns",
    "campaign_create": "create_campaign",
    "campaign_get": "get_campaign",
    "campaign_update": "update_campaign",
    "campaign_action": "campaign_action",
    # Operations
    "dead_letters_list": "dead_letters",
    "dead_letter_replay": "replay_dead_letter",
    "dead_letter_discard": "discard_dead_letter",
    "dead_letters_replay": "replay_dead_letters",
    "sandbox_messages_list": "sandbox_messages",
    # Status events
    "event_endpoint_put": "set_event_endpoint",
    "event_endpoint_get": "get_event_endpoint",
    "event_endpoint_delete": "delete_event_endpoint",
    "event_endpoint_rotate_secret": "rotate_event_secret",
    "event_endpoint_attempts": "event_attempts",
    # Statistics
    "stats": "stats",
    "stats_get": "stats",
    # Provider callbacks
    "callback_ses": None,
    "callback_twilio": None,
}

NOT_FOR_CLIENTS: dict[str, str] = {
    "callback_ses": "called by Amazon SNS with its own signature, never with an API key",
    "callback_twilio": "called by Twilio with its own signature, never with an API key",
}
