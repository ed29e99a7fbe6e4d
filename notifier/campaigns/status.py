"""What a campaign's fan-out asks of it: whether to stop (paused, cancelled), and the end of a run.

The fan-out sits below this app and cannot import it: the campaigns app registers this module as its gate
(notifier.dispatch.fanout.register_campaign_gate) at start-up.
"""

from __future__ import annotations

from django.db import connection
from django.utils import timezone

from notifier.campaigns.models import Campaign

HELD_STATUSES: tuple[str, ...] = (Campaign.Status.PAUSED, Campaign.Status.CANCELLED)


def campaign_stop_reason(campaign_id: int, *, lock: bool) -> str:
    """Return "paused" or "cancelled" when the campaign holds its fan-out back, else ""."""
    if lock:
        # FOR SHARE until the page's insert commits: a pause (an UPDATE of this row) waits for the page
        # and then holds back what it inserted; a page started after the pause sees it here.
        with connection.cursor() as cursor:
            cursor.execute("SELECT status FROM notifier_campaign WHERE id = %s FOR SHARE", [campaign_id])
            row = cursor.fetchone()
        status = row[0] if row else None
    else:
        status = Campaign.objects.filter(pk=campaign_id).values_list("status", flat=True).first()
    if status == Campaign.Status.PAUSED:
        return "paused"
    if status == Campaign.Status.CANCELLED:
        return "cancelled"
    return ""


def campaign_fanout_finished(*, campaign_id: int) -> None:
    """Mark a run's fan-out complete: a one-off campaign is done, a recurring one waits for its next slot."""
    Campaign.objects.filter(pk=campaign_id, status=Campaign.Status.RUNNING, crontab="").update(
        status=Campaign.Status.DONE, updated_at=timezone.now()
    )
    Campaign.objects.filter(pk=campaign_id, status=Campaign.Status.RUNNING).exclude(crontab="").update(
        status=Campaign.Status.SCHEDULED, updated_at=timezone.now()
    )
