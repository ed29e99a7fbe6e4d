"""Metrics read at scrape time: queue depths, the outbox backlog and pending dead letters.

Nobody counts these as they happen: the API's /metrics view (ops/health.py) reads them on each scrape (passive
queue declares on RabbitMQ, one COUNT in PostgreSQL) through `OpsCollector`; the dashboard reads them too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count
from kombu import Connection
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from core.queues import build_queues
from notifier.deadletters.models import DeadLetter
from notifier.deliveries.selectors import outbox_state
from notifier.dispatch import shares
from projects.models import Environment, Project

logger = logging.getLogger(__name__)


def collect_queue_depths(timeout: float | None = None) -> dict[str, tuple[int, int]] | None:
    """Return {queue: (ready messages, consumers)} for every queue of the topology; None if unreachable.

    Passive declares only: a scrape never creates a queue, and a queue missing on the broker is left out.
    """
    timeout = settings.METRICS_BROKER_TIMEOUT_SECONDS if timeout is None else timeout
    # A cluster's nodes (`;`-separated): the first that answers. kombu's own failover does not move on without
    # retries, and a scrape does not retry, so a dead first node would read as a dead broker.
    urls = [url.strip() for url in settings.CELERY_BROKER_URL.split(";") if url.strip()]
    for url in urls[:-1]:
        depths = _queue_depths(url, timeout, quiet=True)
        if depths is not None:
            return depths
    return _queue_depths(urls[-1], timeout, quiet=False)


def _queue_depths(url: str, timeout: float, *, quiet: bool) -> dict[str, tuple[int, int]] | None:
    depths: dict[str, tuple[int, int]] = {}
    try:
        with Connection(url, connect_timeout=timeout) as conn:
            conn.ensure_connection(max_retries=0)
            channel = conn.channel()
            for queue in build_queues():
                try:
                    # kombu types the channel as the abstract StdChannel; py-amqp's channel has queue_declare.
                    _, messages, consumers = channel.queue_declare(  # type: ignore[attr-defined]
                        queue=queue.name, passive=True
                    )
                except conn.channel_errors:
                    # A missing queue closes the channel (404): note nothing, carry on with a fresh one.
                    channel = conn.channel()
                    continue
                depths[queue.name] = (int(messages), int(consumers))
    except Exception as exc:
        if not quiet:
            logger.warning("queue depth collection failed", extra={"error": type(exc).__name__})
        return None
    return depths


def collect_outbox_state() -> tuple[int, float] | None:
    """Return (relay backlog, age in seconds of the oldest delivery waiting in a queue); None if unreachable.

    The backlog is what the relay has to publish: queued deliveries never published (the fast path missed
    them) or published longer ago than OUTBOX_STALE_AFTER_SECONDS. Both read the partial index on queued
    deliveries (delivery_outbox_idx); the count stops at 100,000.
    """
    try:
        return outbox_state(settings.OUTBOX_STALE_AFTER_SECONDS)
    except Exception as exc:
        logger.warning("outbox state read failed", extra={"error": type(exc).__name__})
        return None


def collect_pending_dead_letters(environment_ids: list[int] | None = None) -> dict[str, int] | None:
    """Return pending dead letters per channel (of `environment_ids` only, if given); None if the database is down."""
    try:
        pending = DeadLetter.objects.filter(status=DeadLetter.Status.PENDING)
        if environment_ids is not None:
            pending = pending.filter(delivery__environment_id__in=environment_ids)
        rows = pending.values("channel").annotate(n=Count("id")).order_by()
        return {row["channel"]: int(row["n"]) for row in rows}
    except Exception as exc:
        logger.warning("dead letter count failed", extra={"error": type(exc).__name__})
        return None


def collect_fair_shares() -> list[shares.ProjectShare] | None:
    """Return each project's state on the throttled low queues (notifier/dispatch/shares.py), None on failure."""
    try:
        queues = [f"{channel}.low" for channel in settings.CHANNELS if shares.channel_rate(channel)]
        return shares.state(queues)
    except Exception as exc:
        logger.warning("fair shares read failed", extra={"error": type(exc).__name__})
        return None


def fair_share_families(states: list[shares.ProjectShare]) -> Iterator[Metric]:
    """Yield the per-project backlog, wait, entitled share and deliveries fed of each throttled queue."""
    projects = {s.project for s in states}
    slugs = dict(Project.objects.filter(pk__in=projects).values_list("pk", "slug")) if projects else {}
    labels = ["queue", "project"]
    backlog = GaugeMetricFamily(
        "notifier_fair_backlog", "Subscribers of a project's broadcasts not yet fed into the queue.", labels=labels
    )
    wait = GaugeMetricFamily(
        "notifier_fair_wait_seconds",
        "How long a project's broadcasts have asked for the queue without a grant.",
        labels=labels,
    )
    share = GaugeMetricFamily(
        "notifier_fair_share",
        "A project's entitled share of the queue among the projects asking now (weight).",
        labels=labels,
    )
    fed = CounterMetricFamily(
        "notifier_fair_fed", "Broadcast deliveries a project fed into the queue (its share: their rate).", labels=labels
    )
    for state in states:
        key = [state.queue, slugs.get(state.project, str(state.project))]
        backlog.add_metric(key, state.backlog)
        wait.add_metric(key, state.waiting_seconds)
        share.add_metric(key, state.share)
        fed.add_metric(key, state.fed)
    yield from (backlog, wait, share, fed)


def render_cost_family() -> Metric:
    """Return the seconds a delivery of each slow template cost the send workers to render, by project."""
    family = GaugeMetricFamily(
        "notifier_render_cost_seconds",
        "Rendering time a delivery of a template last cost the send workers (only templates over a millisecond).",
        labels=["project", "environment", "template"],
    )
    costs = shares.render_costs()
    if costs:
        environments = Environment.objects.filter(pk__in={e for e, _ in costs}).values_list(
            "pk", "project__slug", "name"
        )
        names = {pk: (slug, name) for pk, slug, name in environments}
        for (environment_id, template), seconds in sorted(costs.items()):
            slug, name = names.get(environment_id, (str(environment_id), ""))
            family.add_metric([slug, name, template], seconds)
    return family


class OpsCollector(Collector):
    """Read broker and database state at scrape time (only in the API's /metrics, never per worker)."""

    def collect(self) -> Iterator[Metric]:
        """Yield queue depths, consumers, dead-letter depths, broker reachability and pending dead letters."""
        if settings.METRICS_QUEUE_DEPTHS:
            depths = collect_queue_depths()
            up = GaugeMetricFamily("notifier_broker_up", "1 if RabbitMQ answered the scrape's queue declares.")
            up.add_metric([], 0 if depths is None else 1)
            yield up
            depth = GaugeMetricFamily("notifier_queue_depth", "Ready messages per work queue.", labels=["queue"])
            consumers = GaugeMetricFamily("notifier_queue_consumers", "Consumers per work queue.", labels=["queue"])
            dead = GaugeMetricFamily(
                "notifier_dead_letter_queue_depth", "Messages in each dead-letter queue.", labels=["queue"]
            )
            for name, (messages, n_consumers) in sorted((depths or {}).items()):
                if name.startswith("dead."):
                    dead.add_metric([name], messages)
                else:
                    depth.add_metric([name], messages)
                    consumers.add_metric([name], n_consumers)
            yield depth
            yield consumers
            yield dead
        outbox = collect_outbox_state()
        if outbox is not None:
            backlog = GaugeMetricFamily(
                "notifier_outbox_backlog", "Queued deliveries the outbox relay has to publish (missed or stale)."
            )
            backlog.add_metric([], outbox[0])
            yield backlog
            oldest = GaugeMetricFamily(
                "notifier_queued_oldest_seconds",
                "Age of the oldest delivery published to a queue and not yet taken by a worker.",
            )
            oldest.add_metric([], outbox[1])
            yield oldest
        states = collect_fair_shares()
        if states is not None:
            # Exported with no series while no broadcast asks: the alert's expression names them.
            yield from fair_share_families(states)
            yield render_cost_family()
        pending = collect_pending_dead_letters()
        if pending is not None:
            family = GaugeMetricFamily(
                "notifier_dead_letters_pending", "Dead letters awaiting an operator, per channel.", labels=["channel"]
            )
            for channel, n in sorted(pending.items()):
                family.add_metric([channel], n)
            yield family
