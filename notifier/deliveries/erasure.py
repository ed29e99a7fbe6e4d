"""Forget an erased recipient in what notifier keeps: payloads, user_ids, delivery addresses and content.

Connected to preferences.signals.recipient_erased by NotifierConfig.ready(); the rows stay (other records, the
history and the counts point at them), their personal data goes:

- notifications addressed to the recipient: `payload` emptied, `user_id` blanked (a topic's notification is
  not theirs: its payload is the campaign's, shared by every subscriber);
- deliveries to the recipient (in-app inbox items included): `address` and rendered `content` blanked;
- clicks on those deliveries' links (`clicked` events, detail "<source> <url>"): the URL dropped, the source kept;
- status events of those deliveries: the `user_id` in their data blanked (events still owed are sent without);
- the archive: after commit, the task notifier.deliveries.tasks.archive_forget_recipient rewrites the archived days that
  hold the recipient's rows (notifier.deliveries.archive.archive_forget_recipient), when archiving is on.

Workflow runs, their digests and step reasons are forgotten by the workflows app (notifier/workflows/erasure.py).

The hot tables are partitioned by day (notifier/deliveries/partitions.py): each update reads through an index that
leads with the recipient (deliveries) or the user_id (notifications), so it touches only the recipient's rows
in every partition that still exists.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from core.db import bound_cursor, int_array
from core.logs import get_logger
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.status import CLICKED
from preferences.models import Recipient

logger = get_logger(__name__)


def deliveries_forget_recipient(*, recipient: Recipient, at: datetime, user_id: str = "", **_signal: Any) -> None:
    """Forget what was sent to `recipient`: payloads and user_ids, addresses, content and click URLs.

    Status events are forgotten by their own app, workflow runs by theirs (both receive the same signal).
    """
    deliveries = Delivery.objects.filter(recipient=recipient)
    if user_id:
        # By user_id (indexed), not only by recipient: a user_id names one person, also on a notification
        # accepted before its recipient row existed.
        Notification.objects.filter(user_id=user_id).update(payload={}, user_id="", updated_at=at)
    deliveries.update(address="", content=None, updated_at=at)
    delivery_ids = list(deliveries.values_list("pk", flat=True))
    if delivery_ids:
        with bound_cursor() as cursor:
            # The first word is the click's source ("redirect", "inbox", "ses:click"); what follows is the URL the
            # message linked to, rendered from the recipient's payload. The archive keeps the same (archive.py).
            cursor.execute(
                "UPDATE notifier_deliveryevent SET detail = split_part(detail, ' ', 1)"
                " WHERE delivery_id = ANY(%s::bigint[]) AND status = %s AND detail LIKE '%% %%'",
                [int_array(delivery_ids), CLICKED],
            )
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
