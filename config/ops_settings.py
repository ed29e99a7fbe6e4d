"""Operations settings: logging, metrics, tracing, health and retention, all from the environment.

Star-imported at the end of config/settings.py; LOGGING here replaces the basic one defined there.
Names starting with an underscore stay private to this module.
"""

from __future__ import annotations

from core.env import env

# --- Logs --------------------------------------------------------------------------------------------
# One JSON object per line on stderr (LOG_FORMAT=json, the default) or readable lines for a terminal
# (LOG_FORMAT=console). Both mask emails, phone numbers and tokens; see core/logs.py.
LOG_LEVEL = env.str("LOG_LEVEL", "INFO").upper()
LOG_FORMAT = env.str("LOG_FORMAT", "json").lower()
# One access-log line per API request (method, route, status, duration; never the query string).
LOG_REQUESTS = env.bool("LOG_REQUESTS", True)
# With LOG_REQUESTS: at most one line per this many seconds and process for requests answered below 400, the line
# counting the ones left out since (`successes_not_logged`); 0 logs each. 4xx and 5xx are logged each. `make run`
# sets 1: honcho relaying a line per request took about 0.3 ms of the box's CPU per single (decision 0112).
REQUEST_SUCCESS_LOG_SECONDS = env.float("REQUEST_SUCCESS_LOG_SECONDS", 0.0)
# Celery's two INFO lines per task ("received", "succeeded") and beat's line per scheduled send: off unless asked
# for. A single's delivery is a task, so they cost two log lines (and honcho relaying them under `make run`) per
# notification, and beat's workflow wake-up one a second. Asked for, they are written whatever LOG_LEVEL says:
# tests and benchmarks count them in workers that otherwise log warnings only.
CELERY_TASK_LOGS = env.bool("CELERY_TASK_LOGS", False)
_TASK_LOG_LEVEL = "INFO" if CELERY_TASK_LOGS else "WARNING"
# The send workers' audit line per delivery sent ("delivery sent": ids, channel, provider, attempts). A topic of
# a million recipients writes a million of them; every other outcome (failed, retried, dead-lettered, suppressed)
# is logged whatever this says. `make run` turns them off: honcho relaying them took a ninth of a topic's CPU,
# and the send workers' own share dropped too (docs/decisions/0082-make-run-logs-no-line-per-delivery-sent.md).
DELIVERY_SENT_LOGS = env.bool("DELIVERY_SENT_LOGS", True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"scheduled_sends": {"()": "core.logs.ScheduledSendsFilter"}},
    "formatters": {
        "json": {"()": "core.logs.json_formatter"},
        "console": {"()": "core.logs.console_formatter"},
    },
    "handlers": {
        "default": {
            "class": "logging.StreamHandler",
            "formatter": "console" if LOG_FORMAT == "console" else "json",
        },
    },
    "root": {"handlers": ["default"], "level": LOG_LEVEL},
    "loggers": {
        # Django's request logger repeats what our access log says, with the full path: keep its errors only.
        "django.request": {"level": "ERROR", "propagate": True},
        "django.server": {"level": "WARNING", "propagate": True},
        "django.db.backends": {"level": "WARNING"},
        "amqp": {"level": "WARNING"},
        "kombu": {"level": "WARNING"},
        "botocore": {"level": "WARNING"},
        "urllib3": {"level": "WARNING"},
        "gunicorn.error": {"level": LOG_LEVEL, "handlers": ["default"], "propagate": False},
        "gunicorn.access": {"level": "WARNING", "handlers": ["default"], "propagate": False},
        "celery.app.trace": {"level": _TASK_LOG_LEVEL},
        "celery.worker.strategy": {"level": _TASK_LOG_LEVEL},
        # Beat's line per scheduled send goes with them.
        "celery.beat": {"filters": [] if CELERY_TASK_LOGS else ["scheduled_sends"]},
    },
}

# --- Metrics -----------------------------------------------------------------------------------------
# GET /metrics serves Prometheus text. With several processes per container (gunicorn workers, prefork
# Celery children) set PROMETHEUS_MULTIPROC_DIR in the *environment* (prometheus_client reads it at import)
# to an empty directory per container; the endpoint then aggregates every process's samples.
METRICS_ENABLED = env.bool("METRICS_ENABLED", True)
# When set, /metrics and the detail of /readyz need `Authorization: Bearer <METRICS_TOKEN>` (/healthz stays open,
# and /readyz still answers its status code to probes without it).
METRICS_TOKEN = env.str("METRICS_TOKEN")
PROMETHEUS_MULTIPROC_DIR = env.str("PROMETHEUS_MULTIPROC_DIR")
# Celery workers have no HTTP server of their own: the main worker process serves the aggregated samples of
# its children on this port (0 = off). Scrape each worker container on it.
METRICS_WORKER_PORT = env.int("METRICS_WORKER_PORT", 0)
# Queue depths and dead-letter depths are read from RabbitMQ at scrape time with passive declares.
METRICS_QUEUE_DEPTHS = env.bool("METRICS_QUEUE_DEPTHS", True)
METRICS_BROKER_TIMEOUT_SECONDS = env.float("METRICS_BROKER_TIMEOUT_SECONDS", 2.0)

# --- Tracing -----------------------------------------------------------------------------------------
# W3C trace context is always propagated (HTTP traceparent in and out, Celery message headers) and the
# trace id is in every log line. Spans are exported over OTLP/HTTP only when an endpoint is configured;
# the SDK reads its standard OTEL_* variables (OTEL_EXPORTER_OTLP_HEADERS, OTEL_TRACES_SAMPLER, ...) itself.
OTEL_EXPORTER_OTLP_ENDPOINT = env.str("OTEL_EXPORTER_OTLP_ENDPOINT")
OTEL_SERVICE_NAME = env.str("OTEL_SERVICE_NAME", "notifier")

# --- Health ------------------------------------------------------------------------------------------
# /readyz gives each dependency this long before calling it down.
READYZ_TIMEOUT_SECONDS = env.float("READYZ_TIMEOUT_SECONDS", 2.0)

# --- Retention ---------------------------------------------------------------------------------------
# Finished deliveries (and their events) older than this are deleted by ops.retention, in batches of
# RETENTION_BATCH rows per short transaction, for at most RETENTION_MAX_SECONDS per run (the next run
# continues where this one stopped). 0 days turns retention off.
RETENTION_DAYS = env.int("RETENTION_DAYS", 90)
RETENTION_BATCH = env.int("RETENTION_BATCH", 5000)
RETENTION_MAX_SECONDS = env.float("RETENTION_MAX_SECONDS", 600.0)

# --- Archive -----------------------------------------------------------------------------------------
# One day of notifications, deliveries and delivery events is exported to object storage (S3 API) as Parquet
# before the day is dropped (notifier/deliveries/archive.py, docs/operations.md "Archive and restore"). No bucket: off.
ARCHIVE_BUCKET = env.str("ARCHIVE_BUCKET", "")
# Key prefix inside the bucket; files go under <prefix>/v<schema version>/<table>/day=YYYY-MM-DD/.
ARCHIVE_PREFIX = env.str("ARCHIVE_PREFIX", "notifier").strip("/")
# Endpoint override (MinIO, Ceph, moto's server in tests); empty means AWS S3 itself.
ARCHIVE_S3_ENDPOINT_URL = env.str("ARCHIVE_S3_ENDPOINT_URL", "")
# Empty: the region SES and SNS use (AWS_REGION).
ARCHIVE_S3_REGION = env.str("ARCHIVE_S3_REGION", "")
# Credentials of the archive's own writer; empty means boto3's default chain (instance role, AWS_* env).
ARCHIVE_AWS_ACCESS_KEY_ID = env.str("ARCHIVE_AWS_ACCESS_KEY_ID", "")
ARCHIVE_AWS_SECRET_ACCESS_KEY = env.str("ARCHIVE_AWS_SECRET_ACCESS_KEY", "")
# A table's day is cut into files of about this size (a file is closed after the row group that passes it);
# larger files are uploaded in parts of ARCHIVE_UPLOAD_PART_BYTES (S3 multipart upload).
ARCHIVE_FILE_BYTES = env.int("ARCHIVE_FILE_BYTES", 256 * 1024 * 1024)
ARCHIVE_UPLOAD_PART_BYTES = env.int("ARCHIVE_UPLOAD_PART_BYTES", 64 * 1024 * 1024)
# Rows fetched from the server-side cursor at a time, and written as one Parquet row group: memory is bounded
# by this, not by the day's size.
ARCHIVE_BATCH_ROWS = env.int("ARCHIVE_BATCH_ROWS", 100_000)

# --- Progress of long commands (core/progress.py) ---------------------------------------------------
# Not on a terminal (a pipe, a log collector), a long command writes a line with its counts this often.
PROGRESS_INTERVAL_SECONDS = env.float("PROGRESS_INTERVAL_SECONDS", 10.0)
# --- Partitioned hot tables (notifier/deliveries/partitions.py,
# docs/decisions/0054-delivery-log-partitioned-by-day.md) ---
# Notifications, deliveries and delivery events are partitioned by day; days older than DELIVERY_HOT_DAYS
# (today counts as one) are archived through PARTITION_ARCHIVE_HOOK ("module.function", called with the
# day; empty: no archive) and dropped, except the rows that still have work. PARTITIONS_AHEAD_DAYS days
# are created ahead by the migration and the daily maintenance task.
DELIVERY_HOT_DAYS = env.int("DELIVERY_HOT_DAYS", 14)
PARTITIONS_AHEAD_DAYS = env.int("PARTITIONS_AHEAD_DAYS", 7)
PARTITION_ARCHIVE_HOOK = env.str("PARTITION_ARCHIVE_HOOK", "notifier.deliveries.archive.archive_before_drop")
# A dedup_key answers with its first notification for this long (docs/api.md); the key table forgets it after.
DEDUP_WINDOW_HOURS = env.int("DEDUP_WINDOW_HOURS", 72)
# Provider callbacks look for the delivery of a message id in this many recent days first (then in all).
CALLBACK_RECENT_DAYS = env.int("CALLBACK_RECENT_DAYS", 2)
