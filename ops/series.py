"""The operations page's history of queue depths, dead letters and breaker states: sampled, kept a day in Redis.

The broker and the breakers only know "now", so beat runs `notifier.tasks.sample_ops` (kept under its first
name; it lives here) every
OPS_SAMPLE_INTERVAL_SECONDS (60) on the maintenance queue: one sample (ready messages per queue, messages
per dead-letter queue, pending dead letters per channel, each provider's breaker state) goes into one Redis
sorted set scored by its time, and samples older than 24 hours are trimmed in the same round trip. A
sample is a few hundred bytes; a day is 1,440 of them. The dashboard reads the day back and charts it in
5-minute buckets, the worst value of each bucket (the peak depth, the most open breaker).

Redis is the store because this is a chart, not a record: if Redis is down nothing is sampled and the
charts show the gap; a Redis restart loses the history. Two beats sampling at once only add a point.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, cast

import redis
from celery import shared_task
from django.conf import settings
from django.utils import timezone

from channels_app import breaker
from core import task_names
from core.redis_guard import get_redis, rkey
from ops.collectors import collect_pending_dead_letters, collect_queue_depths

logger = logging.getLogger(__name__)

RETENTION = timedelta(hours=24)
# A bound even if beat runs far more often than configured (several beats, a tiny interval).
MAX_SAMPLES = 5000
# Worse is higher: a bucket shows the most open state any of its samples saw.
BREAKER_LEVELS = {"closed": 0, "half_open": 1, "open": 2}


def _key() -> str:
    return rkey("ops", "samples")


def breaker_states() -> list[dict[str, str]]:
    """Return the circuit-breaker state of every configured provider ("n/a" where it cannot be read)."""
    providers = sorted({p for names in settings.CHANNEL_PROVIDERS.values() for p in names})
    result = []
    for provider in providers:
        try:
            value = breaker.state(provider)
        except Exception:
            logger.warning("breaker state unavailable", extra={"provider": provider})
            value = "n/a"
        result.append({"provider": provider, "state": value})
    return result


def ops_sample(*, now: datetime | None = None) -> dict[str, Any] | None:
    """Take one sample of queue depths, dead letters and breaker states and store it; None if Redis failed.

    A part the service could not read (the broker or the database unreachable) is null in the sample, so
    the chart shows a gap rather than a false zero.
    """
    now = now or timezone.now()
    depths = collect_queue_depths()
    sample: dict[str, Any] = {
        "t": now.timestamp(),
        "queues": None if depths is None else {q: m for q, (m, _) in depths.items() if not q.startswith("dead.")},
        "dead_queues": None if depths is None else {q: m for q, (m, _) in depths.items() if q.startswith("dead.")},
        "dead_pending": collect_pending_dead_letters(),
        "breakers": {b["provider"]: b["state"] for b in breaker_states() if b["state"] in BREAKER_LEVELS},
    }
    try:
        pipe = get_redis().pipeline(transaction=False)
        pipe.zadd(_key(), {json.dumps(sample, sort_keys=True): sample["t"]})
        pipe.zremrangebyscore(_key(), "-inf", f"({(now - RETENTION).timestamp()}")
        pipe.zremrangebyrank(_key(), 0, -MAX_SAMPLES - 1)
        pipe.execute()
    except redis.RedisError as exc:
        logger.warning("ops sample not stored", extra={"error": type(exc).__name__})
        return None
    return sample


def ops_samples(*, since: datetime) -> list[dict[str, Any]]:
    """Return the stored samples taken since `since`, oldest first ([] if Redis is unreachable)."""
    try:
        # Without scores Redis answers a list of the stored JSON strings; the stub's union cannot tie that to the call.
        members = cast("list[bytes]", get_redis().zrangebyscore(_key(), since.timestamp(), "+inf"))
    except redis.RedisError as exc:
        logger.warning("ops samples unavailable", extra={"error": type(exc).__name__})
        return []
    return [json.loads(m) for m in members]


def bucket_of(sample: dict[str, Any], labels: Sequence[datetime]) -> int | None:
    """Return the index of the bucket (starting at labels[i], as long as labels[1] - labels[0]) of a sample."""
    if len(labels) < 2:
        return 0 if labels else None
    width = (labels[1] - labels[0]).total_seconds()
    index = int((sample["t"] - labels[0].timestamp()) // width)
    return index if 0 <= index < len(labels) else None


def number_series(
    samples: Sequence[dict[str, Any]], labels: Sequence[datetime], part: str
) -> dict[str, list[float | None]]:
    """Return, per name in the samples' `part` ("queues", "dead_queues", "dead_pending"), the peak per bucket.

    A bucket without a sample that read this part is None (a gap in the line), not 0.
    """
    series: dict[str, list[float | None]] = {}
    for sample in samples:
        values = sample.get(part)
        index = bucket_of(sample, labels)
        if values is None or index is None:
            continue
        for name in series:
            series[name][index] = series[name][index] or 0.0  # read, and absent here: nothing waiting
        for name, value in values.items():
            line = series.setdefault(name, [None] * len(labels))
            line[index] = max(line[index] or 0.0, float(value))
    return series


def total_series(samples: Sequence[dict[str, Any]], labels: Sequence[datetime], part: str) -> list[float | None]:
    """Return the peak per bucket of the sum over the samples' `part` (None where no sample read it)."""
    totals: list[float | None] = [None] * len(labels)
    for sample in samples:
        values = sample.get(part)
        index = bucket_of(sample, labels)
        if values is not None and index is not None:
            totals[index] = max(totals[index] or 0.0, float(sum(values.values())))
    return totals


def breaker_series(samples: Sequence[dict[str, Any]], labels: Sequence[datetime]) -> dict[str, list[str | None]]:
    """Return, per provider, the most open breaker state of each bucket (None without a sample)."""
    series: dict[str, list[str | None]] = {}
    for sample in samples:
        index = bucket_of(sample, labels)
        if index is None:
            continue
        for provider, state in (sample.get("breakers") or {}).items():
            line = series.setdefault(provider, [None] * len(labels))
            current = line[index]
            if current is None or BREAKER_LEVELS.get(state, 0) > BREAKER_LEVELS.get(current, 0):
                line[index] = state
    return dict(sorted(series.items()))


@shared_task(name=task_names.SAMPLE_OPS)
def sample_ops() -> bool:
    """Record queue depths, dead letters and breaker states for the operations charts."""
    return ops_sample() is not None
