"""Publish exhausted deliveries to the dead-letter exchange, where `dead.<channel>` queues hold them.

The database record (notifier.DeadLetter) is what operators work with; the queue message is what alerting on
dead-letter depth sees. Losing the message (broker down) loses nothing: the record is already committed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery import current_app as celery_app
from kombu.exceptions import KombuError

from core.queues import DEAD_LETTER_EXCHANGE

logger = logging.getLogger(__name__)


def publish_dead_letters(items: Sequence[tuple[int, str, int, str]]) -> None:
    """Publish (delivery_id, channel, attempts, last_error) records to `dead.<channel>`."""
    try:
        with celery_app.producer_or_acquire() as producer:
            for delivery_id, channel, attempts, last_error in items:
                producer.publish(
                    {"delivery_id": delivery_id, "channel": channel, "attempts": attempts, "last_error": last_error},
                    exchange=DEAD_LETTER_EXCHANGE,
                    routing_key=f"dead.{channel}",
                    serializer="json",
                    delivery_mode=2,
                    retry=False,
                )
    except (KombuError, OSError) as exc:
        logger.error("dead-letter publish failed (records are in the database): %s", exc)
