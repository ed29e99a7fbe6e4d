"""Fan-out lanes: the resumable position of each topic fan-out, per channel lane."""

from __future__ import annotations

from django.db import models

from notifier.deliveries.models import Notification
from projects.scoping import OwnedManager


class FanoutLane(models.Model):
    """One range of a topic's subscription ids, paged by its own fan-out task from its own checkpoint.

    A large topic is split into a few lanes that run at once on the fan-out worker's processes: while one
    lane's page is in PostgreSQL, another's is being decided in Python (notifier/dispatch/fanout.py).
    """

    notification = models.ForeignKey(
        Notification, on_delete=models.CASCADE, related_name="fanout_lanes", db_constraint=False
    )
    lane = models.PositiveSmallIntegerField()
    # The last subscription id done (exclusive lower bound of the next page) and the inclusive upper bound
    # of the lane; the last lane has none, so subscribers added during the fan-out are still reached.
    cursor = models.BigIntegerField(default=0)
    upper = models.BigIntegerField(null=True, blank=True)
    processed = models.PositiveIntegerField(default=0)
    done = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OwnedManager("notification__environment_id")

    class Meta:
        db_table = "notifier_fanoutlane"
        constraints = [models.UniqueConstraint(fields=["notification", "lane"], name="fanout_lane_uniq")]

    def __str__(self) -> str:
        return f"{self.notification_id} lane {self.lane}"
