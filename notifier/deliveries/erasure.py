"""Forget an erased recipient in what notifier keeps: payloads, user_ids, delivery addresses and content.

Connected to preferences.signals.recipient_erased by NotifierConfig.ready(); the rows stay (other records, the
history and the counts point at them), their personal data goes:

- notifications addressed to the recipient: `payload` emptied, `user_id` blanked (a topic's notification is
  not theirs: its payload is the campaign's, shared by every subscriber);
- deliveries to the recipient (in-app inbox items included): `address` and rendered `content` blanked;
- status events of those deliveries: the `user_id` in their data blanked (events still owed are sent without);
- the archive: after commit, the task notifier.deliveries.tasks.archive_forget_recipient rewrites the archived days that
  hold the recipient's rows (notifier.deliveries.archive.archive_forget_recipient), when archiving is on.

The hot tables are partitioned by day (notifier/deliveries/partitions.py): each update reads through an index that
leads with the recipient (deliveries) or the user_id (notifications), so it touches only the recipient's rows
in every partition that still exists.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from core.logs import get_logger
from notifier.deliveries.models import Delivery, Notification
from preferences.models import Recipient

logger = get_logger(__name__)


def deliveries_forget_recipient(*, recipient: Recipient, at: datetime, user_id: str = "", **_signal: Any) -> None:
    """Forget what was sent to `recipient`: payloads and user_ids, addresses and content (status events: their app)."""
    deliveries = Delivery.objects.filter(recipient=recipient)
    if user_id:
        # By user_id (indexed), not only by recipient: a user_id names one person, also on a notification
        # accepted before its recipient row existed.
        Notification.objects.filter(user_id=user_id).update(payload={}, user_id="", updated_at=at)
    deliveries.update(address="", content=None, updated_at=at)
    if settings.ARCHIVE_BUCKET:
        since = recipient.created_at.date().isoformat()
        transaction.on_commit(lambda: _archive_forget_later(recipient.pk, since))


def _archive_forget_later(recipient_id: int, since: str) -> None:
    """Queue the archive's part of an erasure (object storage is slow: not inside the API request)."""
    from notifier.deliveries.tasks import archive_forget_recipient

    try:
        archive_forget_recipient.apply_async((recipient_id, since), retry=False)
    except Exception as exc:
        logger.error("erasure.archive_not_queued", recipient_id=recipient_id, error=type(exc).__name__)
