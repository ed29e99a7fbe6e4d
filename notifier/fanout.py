"""Fan-out of topic notifications (expanded by a task on the `fanout` queue)."""

from __future__ import annotations


def fanout_start(*, notification_id: object) -> None:
    """Start expanding a topic notification into deliveries."""
    raise NotImplementedError("fan-out is not built yet")
