"""The end of a campaign run, told by the fan-out that finished it.

Apart from notifier/campaigns/services.py because that module starts fan-outs (it imports notifier.fanout): the
fan-out imports this one, so the two never import each other.
"""

from __future__ import annotations

from django.utils import timezone

from notifier.models import Campaign


def campaign_fanout_finished(*, campaign_id: int) -> None:
    """Mark a run's fan-out complete: a one-off campaign is done, a recurring one waits for its next slot."""
    Campaign.objects.filter(pk=campaign_id, status=Campaign.Status.RUNNING, crontab="").update(
        status=Campaign.Status.DONE, updated_at=timezone.now()
    )
    Campaign.objects.filter(pk=campaign_id, status=Campaign.Status.RUNNING).exclude(crontab="").update(
        status=Campaign.Status.SCHEDULED, updated_at=timezone.now()
    )
