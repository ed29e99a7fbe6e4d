"""The Celery application, wired to the RabbitMQ topology of core/queues.py.

Each setting below closes a known way for Celery on RabbitMQ to lose or duplicate a message; docs/guarantees.md
says what they add up to. Apps never import this module: tasks use `shared_task`, publishers
`celery.current_app` (this app is the default one: Celery's Django fix-up sets it when config/__init__.py
imports it with the settings).
"""

from __future__ import annotations

import os

from celery import Celery
from celery.schedules import crontab
from celery.signals import task_postrun, task_prerun, worker_process_init, worker_ready

from core import task_names
from core.db import close_old_task_connections
from core.env import env
from core.heap import freeze_loaded_heap
from core.queues import EXCHANGE, build_queues
from core.tracing import connect_signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("notifier")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_queues=build_queues(),
    task_default_queue="maintenance",
    task_default_exchange=EXCHANGE.name,
    task_default_exchange_type="topic",
    task_default_routing_key="maintenance",
    task_create_missing_queues=False,
    # Durability: persistent messages, publisher confirms (a broker alarm must not drop a publish silently).
    task_default_delivery_mode="persistent",
    broker_transport_options={"confirm_publish": True},
    broker_connection_retry_on_startup=True,
    # A channel error while the consumer (re)starts is retried like a lost connection instead of ending the worker.
    # The case it is for: the node a worker sat on dies and the worker reconnects to another node before the
    # cluster has let go of the dead connection's exclusive control queue (`<node>.celery.pidbox`), whose
    # re-declaration then fails with RESOURCE_LOCKED; Celery called that unrecoverable and the worker stopped
    # consuming, leaving its queues without a consumer until something restarted it. Celery's restart limit spaces
    # the tries (at most five a second, then a pause of a second); an error that persists is logged at each.
    broker_channel_error_retry=True,
    # Late acks, rejected back to the queue if the worker process dies; failed tasks are rejected too, so
    # RabbitMQ dead-letters them instead of acking them away.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_acks_on_failure_or_timeout=False,
    worker_cancel_long_running_tasks_on_connection_loss=True,
    worker_prefetch_multiplier=env.int("CELERY_PREFETCH_MULTIPLIER", 4),
    # Retry delays live in the broker (quorum queues on a topic exchange), not in worker memory.
    broker_native_delayed_delivery_queue_type="quorum",
    # Its set-up goes through the failover list once instead of retrying a dead node for seconds at every
    # reconnect, before consuming anything (core/broker_consumer.py).
    worker_consumer="core.broker_consumer:Consumer",
    worker_detect_quorum_queues=True,
    task_ignore_result=True,
    result_backend=None,
    task_serializer="json",
    accept_content=["json"],
    timezone="UTC",
    beat_scheduler="django_celery_beat.schedulers:DatabaseScheduler",
    worker_hijack_root_logger=False,
    broker_heartbeat=30,
    # Celery's Django fix-up closes every database connection before and after each task, so each task paid
    # for a new PostgreSQL backend: fork, authentication, time zone, and the catalog caches of every partition
    # it touched, about 10 ms of PostgreSQL CPU, half of what a single notification cost end to end. A worker
    # thread keeps its connection instead, dropped as Django drops a request's: when past
    # DATABASE_CONN_MAX_AGE or broken (close_old_task_connections below). The fix-up still closes one every
    # 2 x CELERY_DB_REUSE_MAX tasks; it is set high enough that the age limit is what recycles connections.
    CELERY_DB_REUSE_MAX=1_000_000,
)
app.conf.beat_schedule = {
    "outbox-relay": {
        "task": task_names.OUTBOX_RELAY,
        "schedule": env.float("OUTBOX_RELAY_INTERVAL_SECONDS", 5.0),
        "options": {"queue": "maintenance", "expires": 60},
    },
    "fallback-sweep": {
        "task": task_names.FALLBACK_SWEEP,
        "schedule": env.float("OUTBOX_RELAY_INTERVAL_SECONDS", 5.0),
        "options": {"queue": "maintenance", "expires": 60},
    },
    "workflows-wake": {
        # Every workflow wait is a row; this turns the due ones into advance messages (notifier/workflows).
        "task": task_names.WORKFLOW_WAKE,
        "schedule": env.float("WORKFLOW_WAKE_INTERVAL_SECONDS", 1.0),
        "options": {"queue": "maintenance", "expires": 30},
    },
    "fanout-sweep": {
        "task": task_names.FANOUT_SWEEP,
        "schedule": env.float("FANOUT_SWEEP_INTERVAL_SECONDS", 10.0),
        "options": {"queue": "maintenance", "expires": 120},
    },
    "status-events-sweep": {
        "task": task_names.SWEEP_STATUS_EVENTS,
        "schedule": env.float("EVENT_SWEEP_INTERVAL_SECONDS", 15.0),
        "options": {"queue": "events", "expires": 60},
    },
    "ops-sample": {
        # The operations page's 24-hour charts of queue depths, dead letters and breaker states.
        "task": task_names.SAMPLE_OPS,
        "schedule": env.float("OPS_SAMPLE_INTERVAL_SECONDS", 60.0),
        "options": {"queue": "maintenance", "expires": 60},
    },
    "retention-purge": {
        "task": task_names.RETENTION_PURGE,
        "schedule": crontab(minute=30, hour=3),
        "options": {"queue": "maintenance"},
    },
    # Partitions of the coming days, and the days past DELIVERY_HOT_DAYS archived and dropped.
    "partitions-maintain": {
        "task": task_names.PARTITIONS_MAINTAIN,
        "schedule": crontab(minute=10, hour="*/6"),
        "options": {"queue": "maintenance"},
    },
    "digests-hourly": {
        "task": task_names.FLUSH_DIGESTS,
        "schedule": crontab(minute=0),
        "args": ["hourly_digest"],
        "options": {"queue": "maintenance"},
    },
    "digests-daily": {
        "task": task_names.FLUSH_DIGESTS,
        # Every hour: each run sends the daily digests of the recipients whose local hour is
        # DIGEST_DAILY_LOCAL_HOUR (notifier/dispatch/digest.py), so everyone gets theirs at that hour of their day.
        "schedule": crontab(minute=0),
        "args": ["daily_digest"],
        "options": {"queue": "maintenance"},
    },
}
app.autodiscover_tasks()
# Tasks that live outside an app's tasks.py.
app.conf.imports = ("ops.retention", "ops.series", "notifier.deliveries.partitions")

# Trace context across the broker, task metrics and the worker metrics server.
connect_signals()
task_prerun.connect(close_old_task_connections, weak=False, dispatch_uid="core.db.prerun")
# Each worker process, loaded, keeps its start-up heap out of the collector's full collections (core/heap.py).
worker_process_init.connect(freeze_loaded_heap, weak=False, dispatch_uid="core.heap.process")
worker_ready.connect(freeze_loaded_heap, weak=False, dispatch_uid="core.heap.ready")
task_postrun.connect(close_old_task_connections, weak=False, dispatch_uid="core.db.postrun")
