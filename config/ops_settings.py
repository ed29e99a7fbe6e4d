"""Operations settings: logging, metrics, tracing, health and retention, all from the environment.

Star-imported at the end of config/settings.py; LOGGING here replaces the basic one defined there.
Names starting with an underscore stay private to this module.
"""

from __future__ import annotations

import os


def _env(name: str, default: str) -> str:
    return os.environ.get(name, "").strip() or default


def _env_int(name: str, default: int) -> int:
    return int(_env(name, str(default)))


def _env_float(name: str, default: float) -> float:
    return float(_env(name, str(default)))


def _env_bool(name: str, default: bool) -> bool:
    return _env(name, "true" if default else "false").lower() in {"1", "true", "yes", "on"}


# --- Logs --------------------------------------------------------------------------------------------
# One JSON object per line on stderr (LOG_FORMAT=json, the default) or readable lines for a terminal
# (LOG_FORMAT=console). Both mask emails, phone numbers and tokens; see notifier/logging.py.
LOG_LEVEL = _env("LOG_LEVEL", "INFO").upper()
LOG_FORMAT = _env("LOG_FORMAT", "json").lower()
# One access-log line per API request (method, route, status, duration; never the query string).
LOG_REQUESTS = _env_bool("LOG_REQUESTS", True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "notifier.logging.json_formatter"},
        "console": {"()": "notifier.logging.console_formatter"},
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
    },
}

# --- Metrics -----------------------------------------------------------------------------------------
# GET /metrics serves Prometheus text. With several processes per container (gunicorn workers, prefork
# Celery children) set PROMETHEUS_MULTIPROC_DIR in the *environment* (prometheus_client reads it at import)
# to an empty directory per container; the endpoint then aggregates every process's samples.
METRICS_ENABLED = _env_bool("METRICS_ENABLED", True)
# When set, /metrics and the detail of /readyz need `Authorization: Bearer <METRICS_TOKEN>` (/healthz stays open,
# and /readyz still answers its status code to probes without it).
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
PROMETHEUS_MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
# Celery workers have no HTTP server of their own: the main worker process serves the aggregated samples of
# its children on this port (0 = off). Scrape each worker container on it.
METRICS_WORKER_PORT = _env_int("METRICS_WORKER_PORT", 0)
# Queue depths and dead-letter depths are read from RabbitMQ at scrape time with passive declares.
METRICS_QUEUE_DEPTHS = _env_bool("METRICS_QUEUE_DEPTHS", True)
METRICS_BROKER_TIMEOUT_SECONDS = _env_float("METRICS_BROKER_TIMEOUT_SECONDS", 2.0)

# --- Tracing -----------------------------------------------------------------------------------------
# W3C trace context is always propagated (HTTP traceparent in and out, Celery message headers) and the
# trace id is in every log line. Spans are exported over OTLP/HTTP only when an endpoint is configured;
# the standard OTEL_* variables (OTEL_EXPORTER_OTLP_HEADERS, OTEL_TRACES_SAMPLER, ...) apply as usual.
OTEL_EXPORTER_OTLP_ENDPOINT = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
OTEL_SERVICE_NAME = _env("OTEL_SERVICE_NAME", "notifier")

# --- Health ------------------------------------------------------------------------------------------
# /readyz gives each dependency this long before calling it down.
READYZ_TIMEOUT_SECONDS = _env_float("READYZ_TIMEOUT_SECONDS", 2.0)

# --- Retention ---------------------------------------------------------------------------------------
# Finished deliveries (and their events) older than this are deleted by notifier.retention, in batches of
# RETENTION_BATCH rows per short transaction, for at most RETENTION_MAX_SECONDS per run (the next run
# continues where this one stopped). 0 days turns retention off.
RETENTION_DAYS = _env_int("RETENTION_DAYS", 90)
RETENTION_BATCH = _env_int("RETENTION_BATCH", 5000)
RETENTION_MAX_SECONDS = _env_float("RETENTION_MAX_SECONDS", 600.0)

# --- Archive -----------------------------------------------------------------------------------------
# One day of notifications, deliveries and delivery events is exported to object storage (S3 API) as Parquet
# before the day is dropped (notifier/archive.py, docs/operations.md "Archive and restore"). No bucket: off.
ARCHIVE_BUCKET = _env("ARCHIVE_BUCKET", "")
# Key prefix inside the bucket; files go under <prefix>/v<schema version>/<table>/day=YYYY-MM-DD/.
ARCHIVE_PREFIX = _env("ARCHIVE_PREFIX", "notifier").strip("/")
# Endpoint override (MinIO, Ceph, moto's server in tests); empty means AWS S3 itself.
ARCHIVE_S3_ENDPOINT_URL = _env("ARCHIVE_S3_ENDPOINT_URL", "")
ARCHIVE_S3_REGION = _env("ARCHIVE_S3_REGION", "") or _env("AWS_REGION", _env("AWS_DEFAULT_REGION", "us-east-1"))
# Credentials of the archive's own writer; empty means boto3's default chain (instance role, AWS_* env).
ARCHIVE_AWS_ACCESS_KEY_ID = _env("ARCHIVE_AWS_ACCESS_KEY_ID", "")
ARCHIVE_AWS_SECRET_ACCESS_KEY = _env("ARCHIVE_AWS_SECRET_ACCESS_KEY", "")
# A table's day is cut into files of about this size (a file is closed after the row group that passes it);
# larger files are uploaded in parts of ARCHIVE_UPLOAD_PART_BYTES (S3 multipart upload).
ARCHIVE_FILE_BYTES = _env_int("ARCHIVE_FILE_BYTES", 256 * 1024 * 1024)
ARCHIVE_UPLOAD_PART_BYTES = _env_int("ARCHIVE_UPLOAD_PART_BYTES", 64 * 1024 * 1024)
# Rows fetched from the server-side cursor at a time, and written as one Parquet row group: memory is bounded
# by this, not by the day's size.
ARCHIVE_BATCH_ROWS = _env_int("ARCHIVE_BATCH_ROWS", 100_000)
# --- Partitioned hot tables (notifier/partitions.py, docs/decisions.md) ---------------------------------
# Notifications, deliveries and delivery events are partitioned by day; days older than DELIVERY_HOT_DAYS
# (today counts as one) are archived through PARTITION_ARCHIVE_HOOK ("module.function", called with the
# day; empty: no archive) and dropped, except the rows that still have work. PARTITIONS_AHEAD_DAYS days
# are created ahead by the migration and the daily maintenance task.
DELIVERY_HOT_DAYS = _env_int("DELIVERY_HOT_DAYS", 14)
PARTITIONS_AHEAD_DAYS = _env_int("PARTITIONS_AHEAD_DAYS", 7)
PARTITION_ARCHIVE_HOOK = _env("PARTITION_ARCHIVE_HOOK", "notifier.archive.archive_before_drop")
# A dedup_key answers with its first notification for this long (API.md); the key table forgets it after.
DEDUP_WINDOW_HOURS = _env_int("DEDUP_WINDOW_HOURS", 72)
# Provider callbacks look for the delivery of a message id in this many recent days first (then in all).
CALLBACK_RECENT_DAYS = _env_int("CALLBACK_RECENT_DAYS", 2)
