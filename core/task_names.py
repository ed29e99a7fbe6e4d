"""Every Celery task's name, in one place: the wire names that messages, beat rows and routes carry.

A task is registered under its name here (`@shared_task(name=task_names.X)`) and published by it
(`send_task(task_names.X, …)`, the beat schedule), so no module spells another's task. A name outlives the
code that defines it (messages in flight and beat rows in the database carry it): it changes only with a
migration of those, which is why several still carry an older module's path.
"""

from __future__ import annotations

# The send pipeline (channels_app.tasks).
SEND_DELIVERIES = "channels_app.tasks.send_deliveries"
SEND_STATUS_EVENTS = "channels_app.tasks.send_status_events"
SWEEP_STATUS_EVENTS = "channels_app.tasks.sweep_status_events"
# The delivery log (notifier.deliveries.tasks, notifier.deliveries.partitions).
OUTBOX_RELAY = "notifier.tasks.outbox_relay"
FALLBACK_DUE = "notifier.tasks.fallback_due"
FALLBACK_SWEEP = "notifier.tasks.fallback_sweep"
ARCHIVE_FORGET_RECIPIENT = "notifier.tasks.archive_forget_recipient"
PARTITIONS_MAINTAIN = "notifier.partitions.maintain"
# Dispatch (notifier.dispatch.tasks).
FANOUT_TOPIC = "notifier.tasks.fanout_topic"
FANOUT_SWEEP = "notifier.tasks.fanout_sweep"
FLUSH_DIGESTS = "preferences.tasks.flush_digests"
NOOP = "notifier.tasks.noop"
# Campaigns and workflows.
RUN_CAMPAIGN = "notifier.tasks.run_campaign"
WORKFLOW_ADVANCE = "workflows.advance"
WORKFLOW_WAKE = "workflows.wake"
# Recipients (preferences.tasks).
IMPORT_RECIPIENTS = "preferences.tasks.import_recipients"
# Operations (ops).
SAMPLE_OPS = "notifier.tasks.sample_ops"
RETENTION_PURGE = "notifier.retention.purge_old_deliveries"

ALL = frozenset(value for key, value in dict(globals()).items() if key.isupper() and isinstance(value, str))
