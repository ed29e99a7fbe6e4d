"""Settings for Notifier, read from the environment with local defaults.

Every value an operator may want to change is an environment variable; the defaults point at PostgreSQL,
RabbitMQ and Redis on 127.0.0.1 so that `make run` works on a laptop with no configuration at all.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from core.chat import CHAT_CHANNELS
from core.converters import ID_SCHEMA
from core.database_url import parse_database_url
from core.env import env

BASE_DIR = Path(__file__).resolve().parent.parent
# The one version number: pyproject.toml's, also the OpenAPI schema's (CHANGELOG.md names each release).
VERSION: str = tomllib.loads((BASE_DIR / "pyproject.toml").read_text())["project"]["version"]


# Safe by default: production unless DEVELOPMENT=true says otherwise (`make run` and the test suite say so).
# Development mode allows the built-in SECRET_KEY and plain-HTTP cookies; DEBUG is off unless set, in any mode.
DEVELOPMENT = env.bool("DEVELOPMENT", False)
DEBUG = env.bool("DEBUG", False)
# The secret key signs admin sessions, unsubscribe links, preference links and inbox tokens: with a known
# value they are forgeable, so outside development there is no start without one.
_SECRET_KEY_FROM_ENV = env.str("SECRET_KEY")
if not _SECRET_KEY_FROM_ENV and not DEVELOPMENT:
    raise ImproperlyConfigured(
        "SECRET_KEY is not set. Set it in the environment (50+ random characters), or DEVELOPMENT=true on a laptop."
    )
SECRET_KEY = _SECRET_KEY_FROM_ENV or "dev-only-insecure-secret-key-change-me"
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver")
# PORT is the API port of `make run` (and of gunicorn.conf.py's default bind).
PORT = env.int("PORT", 8000)
PUBLIC_BASE_URL = env.str("PUBLIC_BASE_URL", f"http://127.0.0.1:{PORT}")
# Preference-center links: the default lifetime (also of the links in emails and `{{ preferences_url }}`) and
# the longest a caller may ask for.
PREFERENCE_LINK_TTL_SECONDS = env.int("PREFERENCE_LINK_TTL_SECONDS", 30 * 86400)
PREFERENCE_LINK_MAX_TTL_SECONDS = env.int("PREFERENCE_LINK_MAX_TTL_SECONDS", 90 * 86400)

# --- Behind a TLS-terminating proxy (docs/operations.md, docs/security.md) ------------------------------
# "HTTP_X_FORWARDED_PROTO,https": trust that header from the proxy to know a request came over HTTPS. Only set
# it when the proxy always sets (or strips) the header.
_proxy_ssl = env.list("SECURE_PROXY_SSL_HEADER")
SECURE_PROXY_SSL_HEADER = (_proxy_ssl[0], _proxy_ssl[1]) if len(_proxy_ssl) == 2 else None
# The admin's origin(s) as the browser sees them ("https://notifier.example.com"), for the CSRF origin check.
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS")
# Cookies only over HTTPS, except in development (plain http://127.0.0.1).
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", not DEVELOPMENT)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", not DEVELOPMENT)
SESSION_COOKIE_HTTPONLY = True
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", False)
# Probes and scrapes inside the cluster speak plain HTTP to the process: never redirect them.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", False)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and ReDoc as our own static files: /api/docs/ works offline
    "django_celery_beat",
    "core",
    # The notifier's apps, one per context (docs/architecture.md has the map).
    "notifier.clients",
    "notifier.deliveries",
    "notifier.statusevents",
    "notifier.accepting",
    "notifier.dispatch",
    "notifier.deadletters",
    "notifier.campaigns",
    "notifier.callbacks",
    "notifier.tracking",
    "notifier.inbox",
    "notifier.workflows",
    "notifier.staff",
    "channels_app",
    "templates_app",
    "preferences",
    "projects",
    "audit",
]

MIDDLEWARE = [
    "notifier.clients.middleware.RequestContextMiddleware",
    # Before anything reads a body: oversized bodies are a 413 unread, control characters in URLs refused.
    "core.bodies.BodyLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # CORS for the browser inbox (/inbox/v1/ only, INBOX_ALLOWED_ORIGINS).
    "notifier.inbox.cors.InboxCorsMiddleware",
    # Serves the admin's static files under gunicorn (collected into STATIC_ROOT by collectstatic).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
# Requests under API_PATH_PREFIX (API keys and JSON: no session, form, cookie or frame) skip the pages' middleware
# (core/handlers.py, served so by config/wsgi.py): about a twentieth of the send endpoint's CPU.
API_PATH_PREFIX = "/api/v1/"
PAGE_MIDDLEWARE = [
    "notifier.inbox.cors.InboxCorsMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Staff permissions per project: a member's role applies to the objects of the project it was given in
# (notifier/staff/backends.py; docs/admin.md, "Projects and roles"). Otherwise Django's ModelBackend.
AUTHENTICATION_BACKENDS = ["notifier.staff.backends.ProjectRoleBackend"]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The admin's index and navigation with the operations dashboard in them (config/templates/admin/).
        "DIRS": [Path(__file__).resolve().parent / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "ops.context_processors.ops_links",
            ],
        },
    },
]

# One host, or libpq's list of a primary and its standbys with `?target_session_attrs=read-write`, so that after
# a failover new connections find the promoted standby (core/database_url.py, docs/operations.md).
DATABASES = {
    "default": parse_database_url(
        env.str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/notifier"),
        conn_max_age=env.int("DATABASE_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
# Django's backend, with a health check that asks the server only when the connection's socket has something to
# read (core/postgresql/base.py): no `SELECT 1` round trip per request while the connection is quiet.
DATABASES["default"]["ENGINE"] = "core.postgresql"
# A primary that goes silent (its host or network gone, or the process hung) must cost seconds, not a hang: the
# API then answers 503 and the workers retry, and libpq's host list finds the promoted standby. libpq's
# connection options (docs/resilience.md, "A silent database"); a value given in DATABASE_URL wins.
_DB_OPTIONS = DATABASES["default"].setdefault("OPTIONS", {})
# Connecting (TCP, TLS and the start-up exchange) gives up after this long, per host of the list.
_DB_OPTIONS.setdefault("connect_timeout", env.int("DATABASE_CONNECT_TIMEOUT", 3))
# An established connection whose peer vanished: keepalive probes after 10 s idle, every 3 s, 3 unanswered
# ones end it (about 19 s); a write the peer does not acknowledge ends it after DATABASE_TCP_USER_TIMEOUT_MS.
_DB_OPTIONS.setdefault("keepalives", 1)
_DB_OPTIONS.setdefault("keepalives_idle", env.int("DATABASE_KEEPALIVES_IDLE", 10))
_DB_OPTIONS.setdefault("keepalives_interval", env.int("DATABASE_KEEPALIVES_INTERVAL", 3))
_DB_OPTIONS.setdefault("keepalives_count", env.int("DATABASE_KEEPALIVES_COUNT", 3))
_DB_OPTIONS.setdefault("tcp_user_timeout", env.int("DATABASE_TCP_USER_TIMEOUT_MS", 10_000))
# The server cancels a statement running longer than this (0: never). gunicorn.conf.py sets 30 s for the API, so
# a request never waits on the database past gunicorn's own timeout; workers and jobs (retention, migrations)
# keep no limit. Sent as the start-up `options` parameter (see docs/resilience.md for PgBouncer).
DATABASE_STATEMENT_TIMEOUT_SECONDS = env.float("DATABASE_STATEMENT_TIMEOUT_SECONDS", 0.0)
if DATABASE_STATEMENT_TIMEOUT_SECONDS > 0 and "options" not in _DB_OPTIONS:
    _DB_OPTIONS["options"] = f"-c statement_timeout={int(DATABASE_STATEMENT_TIMEOUT_SECONDS * 1000)}"
# The hot-path statements (core.db.bound_cursor: fan-out pages, claims, outcomes) bind on the server; after
# this many runs on a connection psycopg prepares them, so PostgreSQL stops planning them again for every batch.
# Django's own queries bind on the client and are never prepared. "off" turns it off (e.g. behind a pooler in
# transaction mode that does not track prepared statements).
_DB_OPTIONS["prepare_threshold"] = env.int_or_off("DATABASE_PREPARE_THRESHOLD", 5)
# Parallel test runs (one per developer sandbox) each get their own test database, vhost and Redis prefix
# by setting NOTIFIER_TEST_NS; see tests/conftest.py.
TEST_NAMESPACE = env.str("NOTIFIER_TEST_NS", "main")
DATABASES["default"]["TEST"] = {"NAME": f"test_notifier_{TEST_NAMESPACE}"}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", str(BASE_DIR / "var" / "static")))
# WhiteNoise serves from here (filled by collectstatic in `make run` and the image); it must exist.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)

# Request bodies: the batch endpoint takes up to 1,000 items; anything above this limit is a 413, refused before
# it is read (core/bodies.py), on every endpoint.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("MAX_REQUEST_BYTES", 5 * 1024 * 1024)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["notifier.clients.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["notifier.clients.auth.ScopePermission"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "core.negotiation.JsonFirstNegotiation",
    # Bounded: the body limit, JSON nesting, text PostgreSQL can store (core/bodies.py).
    "DEFAULT_PARSER_CLASSES": ["core.bodies.JSONParser"],
    "EXCEPTION_HANDLER": "core.errors.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["notifier.clients.rate_limit.ApiClientRateThrottle"],
    "DEFAULT_SCHEMA_CLASS": "core.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Notifier API",
    "DESCRIPTION": "Send notifications over push, email, SMS, in-app and webhooks.",
    "VERSION": VERSION,
    # `check --deploy` is about the deployment (docs/operations.md); the schema is checked by `make test` with
    # `manage.py spectacular --validate --fail-on-warn` instead (docs/api.md).
    "ENABLE_DJANGO_DEPLOY_CHECK": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SERVE_INCLUDE_SCHEMA": False,
    "ENUM_NAME_OVERRIDES": {"ChannelEnum": "core.openapi.CHANNEL_CHOICES"},
    # Ids in paths (`<id:...>`, core/converters.py): integers up to the largest bigint.
    "PATH_CONVERTER_OVERRIDES": {"id": ID_SCHEMA},
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "core.openapi.describe_tags"],
}

# --- Redis -------------------------------------------------------------------------------------------
REDIS_URL = env.str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Redis behind Sentinel: the sentinels ("host:port,host:port") and the name of the master they watch. When set,
# the master is found through them (and found again after a failover); REDIS_URL then gives only the database
# number and the credentials (core/redis_guard.py, docs/operations.md).
REDIS_SENTINELS = env.list("REDIS_SENTINELS")
REDIS_SENTINEL_MASTER = env.str("REDIS_SENTINEL_MASTER", "notifier")
REDIS_SENTINEL_PASSWORD = env.str("REDIS_SENTINEL_PASSWORD")
# Prefix for every Redis key this service writes, so several deployments (or test runs) can share a server.
REDIS_KEY_PREFIX = env.str("REDIS_KEY_PREFIX", "notifier:")
# Group commit of single accepts (core/group_commit.py): requests that arrive while another accept of
# the same
# process is writing are written together, in one transaction, at most ACCEPT_GROUP_MAX at a time.
ACCEPT_GROUP_COMMIT = env.bool("ACCEPT_GROUP_COMMIT", True)
ACCEPT_GROUP_MAX = env.int("ACCEPT_GROUP_MAX", 64)
# The Redis fast path forgets a dedup_key with the window (DEDUP_WINDOW_HOURS, config/ops_settings.py).
DEDUP_TTL_SECONDS = env.int("DEDUP_TTL_SECONDS", env.int("DEDUP_WINDOW_HOURS", 72) * 3600)

# --- Celery on RabbitMQ ------------------------------------------------------------------------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
CELERY_TASK_ALWAYS_EAGER = False
# The settings that make the broker hand-off durable are in config/celery.py; the queue topology in core/queues.py.

# --- Channels, priorities and categories -------------------------------------------------------------
# The chat networks (core/chat.py: slack, teams, discord, telegram, whatsapp) are channels like the others.
CHANNELS = ["push", "email", "sms", "inapp", "webhook", *CHAT_CHANNELS]
# A category decides the default priority, the highest priority a request may ask for (max_priority; when left
# out, the default priority is also the highest), whether a recipient may switch it off, and whether quiet
# hours hold it back. A send's category is its template's (notifier/accepting/policy.py). Override with
# NOTIFIER_CATEGORIES as JSON of the same shape.
NOTIFIER_CATEGORIES: dict[str, dict[str, object]] = env.json(
    "NOTIFIER_CATEGORIES",
    {
        "security": {"priority": "high", "max_priority": "high", "optional": False, "quiet_hours": False},
        "transactional": {"priority": "high", "max_priority": "high", "optional": False, "quiet_hours": False},
        "social": {"priority": "normal", "max_priority": "normal", "optional": True, "quiet_hours": True},
        "marketing": {"priority": "low", "max_priority": "normal", "optional": True, "quiet_hours": True},
    },
)

# Deliveries: attempts before a delivery is dead-lettered, the backoff curve, and the lease after which a
# delivery stuck in `sending` (its worker died mid-call) is reclaimed. The lease is short because a live worker
# renews it (SENDING_HEARTBEAT_SECONDS): only a dead worker's claim runs out, and it is taken again within
# lease + relay interval (docs/decisions/0092-short-leases-kept-alive.md).
DELIVERY_MAX_ATTEMPTS = env.int("DELIVERY_MAX_ATTEMPTS", 6)
RETRY_BACKOFF_BASE_SECONDS = env.float("RETRY_BACKOFF_BASE_SECONDS", 2.0)
RETRY_BACKOFF_MAX_SECONDS = env.float("RETRY_BACKOFF_MAX_SECONDS", 600.0)
SENDING_LEASE_SECONDS = env.int("SENDING_LEASE_SECONDS", 30)
# The outbox relay re-publishes deliveries still `queued` this long after their last publish when their queue is
# empty (the message was lost), and publishes a row never marked published after a quarter of it (10 s: the
# API's own publish failed, e.g. the broker was down). It runs every OUTBOX_RELAY_INTERVAL_SECONDS.
OUTBOX_REPUBLISH_AFTER_SECONDS = env.int("OUTBOX_REPUBLISH_AFTER_SECONDS", 40)
OUTBOX_RELAY_INTERVAL_SECONDS = env.float("OUTBOX_RELAY_INTERVAL_SECONDS", 5.0)
# A delivery published but still `queued` after this long is published again (its message was lost, or it
# sits behind a very deep backlog, where the duplicate message is harmless: claims are idempotent).
OUTBOX_STALE_AFTER_SECONDS = env.int("OUTBOX_STALE_AFTER_SECONDS", 1800)
OUTBOX_RELAY_BATCH = env.int("OUTBOX_RELAY_BATCH", 5000)
# Workflows (docs/workflows.md): how often the wake relay publishes the runs that are due, how many it takes
# per page, how many run ids go in one advance message (a large wake-up spreads over the workers), and after
# how long a run's unanswered message counts as lost and is published again.
WORKFLOW_WAKE_INTERVAL_SECONDS = env.float("WORKFLOW_WAKE_INTERVAL_SECONDS", 1.0)
WORKFLOW_WAKE_BATCH = env.int("WORKFLOW_WAKE_BATCH", 5000)
WORKFLOW_ADVANCE_BATCH = env.int("WORKFLOW_ADVANCE_BATCH", 100)
WORKFLOW_REPUBLISH_AFTER_SECONDS = env.int("WORKFLOW_REPUBLISH_AFTER_SECONDS", 60)
# Waits up to this long travel as delayed broker messages; longer ones (quiet hours, send_at) stay in the
# database and the relay wakes them.
BROKER_DELAY_MAX_SECONDS = env.int("BROKER_DELAY_MAX_SECONDS", 900)
# The API hands accepted deliveries to a per-process background publisher (no broker confirm in the request;
# concurrent requests' ids share a message). Off: each request publishes after its own commit.
PUBLISH_IN_BACKGROUND = env.bool("PUBLISH_IN_BACKGROUND", True)
# How long that publisher lets accepted normal- and low-priority deliveries wait for others before it publishes
# them (a burst then shares messages); a high-priority one leaves at once and takes the waiting ones along.
PUBLISH_LINGER_MS = env.float("PUBLISH_LINGER_MS", 20.0)
# Deliveries per broker message on the fan-out path (one for a single transactional notification).
SEND_BATCH_SIZE = env.int("SEND_BATCH_SIZE", 500)
# A send task with fewer ids takes the messages waiting on its queue into its batch, and a worker's threads send
# their small tasks of one queue together, up to this many ids (0: the channel's first provider's calls in
# flight; 1: every message is sent on its own).
SEND_GATHER_MAX = env.int("SEND_GATHER_MAX", 0)
# A small send task that has waited this long behind its queue's batch in flight (one slow receiver can hold a
# batch open up to PROVIDER_CALL_DEADLINE_SECONDS) starts a batch of its own beside it, with whatever waits.
SEND_COMBINE_MAX_WAIT_SECONDS = env.float("SEND_COMBINE_MAX_WAIT_SECONDS", 0.5)
# Provider calls made at once by one worker process for a batch.
PROVIDER_CONCURRENCY = env.int("PROVIDER_CONCURRENCY", 16)
# The total time one provider call may take (connect, send and the whole answer, however slowly it drips);
# past it the call is given up as ambiguous (retried on the same provider with the same idempotency key).
PROVIDER_CALL_DEADLINE_SECONDS = env.float("PROVIDER_CALL_DEADLINE_SECONDS", 30.0)
# A running batch renews its lease (claimed_at) this often, so no batch is ever handed to a second worker
# while its worker lives, however long it runs (the arithmetic: docs/decisions/0022-sending-lease-renewed.md).
# 0: a third of the lease. After a failed renewal (the database away) it tries again every second.
SENDING_HEARTBEAT_SECONDS = env.float("SENDING_HEARTBEAT_SECONDS", 0.0)
# Answers received while the database is away are kept in memory and their write retried this long before the
# batch gives up (its deliveries are then reclaimed after the lease). The lease is renewed meanwhile as soon as
# the database answers again, so this may be longer than the lease.
OUTCOME_WRITE_RETRY_SECONDS = env.float("OUTCOME_WRITE_RETRY_SECONDS", 150.0)
# Answers written together at most; the pipeline also writes whatever arrived every FLUSH_INTERVAL.
OUTCOME_FLUSH_MAX = env.int("OUTCOME_FLUSH_MAX", 0)  # 0: the provider's calls in flight
OUTCOME_FLUSH_INTERVAL_SECONDS = env.float("OUTCOME_FLUSH_INTERVAL_SECONDS", 0.2)

# The local hour (in each recipient's time zone) at which daily digests are sent.
DIGEST_DAILY_LOCAL_HOUR = env.int("DIGEST_DAILY_LOCAL_HOUR", 8)
# An SMS longer than this many segments fails with reason too_long before any provider is called.
SMS_MAX_SEGMENTS = env.int("SMS_MAX_SEGMENTS", 6)

# Providers per channel, in failover order. "sandbox" records instead of sending; it is the default for
# every channel so the whole pipeline runs without any provider account.
CHANNEL_PROVIDERS: dict[str, list[str]] = {
    channel: env.list(f"{channel.upper()}_PROVIDERS", "inapp" if channel == "inapp" else "sandbox")
    for channel in CHANNELS
}
# Send tasks: a per-process ceiling on messages per second (e.g. "200/s"; empty: none; the real provider limit is
# the shared Redis bucket), and the longest delay between retries of a send whose database is away.
SEND_TASK_RATE_LIMIT = env.str("SEND_TASK_RATE_LIMIT") or None
SEND_TASK_DB_RETRY_MAX_SECONDS = env.float("SEND_TASK_DB_RETRY_MAX_SECONDS", 30.0)
# Test-only knob for the sandbox: "fail:N" (retriable N times), "permanent", "slow:MS", "throttle:N".
SANDBOX_BEHAVIOUR = env.str("SANDBOX_BEHAVIOUR")

# Fan-out pages and pacing, and the backlog beyond which low-priority requests are shed (docs/fanout.md).
FANOUT_PAGE_SIZE = env.int("FANOUT_PAGE_SIZE", 5000)
# A workflow trigger's page writes runs, each advanced later by a message on the fan-out queue (about a tenth of
# the speed they are written at): a page this size is about a second of advance work ahead of anyone else's.
FANOUT_RUNS_PAGE_SIZE = env.int("FANOUT_RUNS_PAGE_SIZE", 1000)
FANOUT_RUN_SECONDS = env.float("FANOUT_RUN_SECONDS", 5.0)
FANOUT_PACE_WINDOW_SECONDS = env.float("FANOUT_PACE_WINDOW_SECONDS", 10.0)
FANOUT_STALL_SECONDS = env.int("FANOUT_STALL_SECONDS", 30)
# In-app deliveries of a topic stored `sent` by the fan-out page itself, not sent through the in-app worker.
FANOUT_INAPP_DIRECT = env.bool("FANOUT_INAPP_DIRECT", True)
# Deliveries per second a topic's fan-out may put into each `<channel>.high` queue, shared by every fan-out
# worker ("channel=rate;…", "*" for the others, 0 unpaced): OTPs published meanwhile never queue behind it.
FANOUT_HIGH_PACE = env.str("FANOUT_HIGH_PACE", "*=500;inapp=10000")
# A topic of at least FANOUT_LANE_MIN_SUBSCRIBERS is split into FANOUT_LANES ranges fanned out at once; run the
# fan-out worker with at least that concurrency. Campaigns (rate-capped) always use one lane.
FANOUT_LANES = env.int("FANOUT_LANES", 2)
FANOUT_LANE_MIN_SUBSCRIBERS = env.int("FANOUT_LANE_MIN_SUBSCRIBERS", 10_000)
# Broadcasts feed a throttled low queue at most FAIR_HORIZON_SECONDS of its provider's rate ahead, in turns
# weighted by Project.weight (notifier/dispatch/shares.py, docs/fanout.md).
FAIR_SHARES = env.bool("FAIR_SHARES", True)
FAIR_HORIZON_SECONDS = env.float("FAIR_HORIZON_SECONDS", 1.0)
BACKPRESSURE_LOW_QUEUE_DEPTH = env.int("BACKPRESSURE_LOW_QUEUE_DEPTH", 50_000)
BACKPRESSURE_CACHE_SECONDS = env.float("BACKPRESSURE_CACHE_SECONDS", 1.0)
BACKPRESSURE_RETRY_AFTER_SECONDS = env.float("BACKPRESSURE_RETRY_AFTER_SECONDS", 30.0)

# Shared provider limits and circuit breakers (JSON per provider; see docs/resilience.md).
PROVIDER_RATE_LIMITS: dict[str, dict[str, object]] = env.json("PROVIDER_RATE_LIMITS", {})
PROVIDER_CIRCUIT_BREAKERS: dict[str, dict[str, object]] = env.json("PROVIDER_CIRCUIT_BREAKERS", {})
RESILIENCE_ASSUMED_WORKERS = env.int("RESILIENCE_ASSUMED_WORKERS", 4)

# Requests per API client across every API process unless the client has its own rate_limit (docs/security.md).
API_CLIENT_RATE_LIMIT = env.str("API_CLIENT_RATE_LIMIT", "200/s")

# Template budgets (templates_app/budget.py): per rendering of one channel, for sends and previews alike.
TEMPLATE_MAX_PART_CHARS = env.int("TEMPLATE_MAX_PART_CHARS", 100_000)
TEMPLATE_MAX_RENDER_CHARS = env.int("TEMPLATE_MAX_RENDER_CHARS", 1_000_000)
TEMPLATE_MAX_LOOP_ITERATIONS = env.int("TEMPLATE_MAX_LOOP_ITERATIONS", 10_000)
TEMPLATE_MAX_RENDER_SECONDS = env.float("TEMPLATE_MAX_RENDER_SECONDS", 1.0)
TEMPLATE_MAX_WIDTH = env.int("TEMPLATE_MAX_WIDTH", 1_000)
TEMPLATE_MAX_NODES = env.int("TEMPLATE_MAX_NODES", 5_000)  # per part, refused at save (compile cost)
# Templates outside the bounded subset render in child processes (templates_app/isolation.py, docs/templates.md):
# this many per API or worker process, each limited to its start-up size plus this much memory.
TEMPLATE_RENDER_PROCESSES = env.int("TEMPLATE_RENDER_PROCESSES", 2)
TEMPLATE_RENDER_MEMORY_MB = env.int("TEMPLATE_RENDER_MEMORY_MB", 256)
TEMPLATE_RENDER_KILL_GRACE_SECONDS = env.float("TEMPLATE_RENDER_KILL_GRACE_SECONDS", 0.25)
TEMPLATE_RENDER_WAIT_SECONDS = env.float("TEMPLATE_RENDER_WAIT_SECONDS", 10.0)
TEMPLATE_INPROCESS_PAYLOAD_CHARS = env.int("TEMPLATE_INPROCESS_PAYLOAD_CHARS", 65_536)

# Where tracked links and the open pixel point (empty: PUBLIC_BASE_URL).
TRACKING_BASE_URL = env.str("TRACKING_BASE_URL")

# Webhooks reach only public addresses unless this is on (local development and tests only).
WEBHOOK_ALLOW_PRIVATE_TARGETS = env.bool("WEBHOOK_ALLOW_PRIVATE_TARGETS", False)

# Status events to calling services (docs/reach.md): the retry curve of a failing endpoint, how long an event
# is retried before it is given up, and how long one sender run keeps a worker before yielding it.
EVENT_RETRY_BASE_SECONDS = env.float("EVENT_RETRY_BASE_SECONDS", 5.0)
EVENT_RETRY_MAX_SECONDS = env.float("EVENT_RETRY_MAX_SECONDS", 3600.0)
EVENT_RETRY_WINDOW_SECONDS = env.int("EVENT_RETRY_WINDOW_SECONDS", 24 * 3600)
EVENT_SENDER_RUN_SECONDS = env.float("EVENT_SENDER_RUN_SECONDS", 10.0)
EVENT_SENDER_LEASE_SECONDS = env.float("EVENT_SENDER_LEASE_SECONDS", 120.0)
EVENT_MAX_BATCH = 500

# The inbox in a browser (docs/reach.md): origins allowed to call /inbox/v1/, inbox token lifetimes, the
# stream's heartbeat, and how far back a resumed stream replays (covers items committed out of order).
INBOX_ALLOWED_ORIGINS = env.list("INBOX_ALLOWED_ORIGINS", "")
INBOX_TOKEN_DEFAULT_TTL_SECONDS = env.int("INBOX_TOKEN_DEFAULT_TTL_SECONDS", 3600)
INBOX_TOKEN_MAX_TTL_SECONDS = env.int("INBOX_TOKEN_MAX_TTL_SECONDS", 24 * 3600)
INBOX_HEARTBEAT_SECONDS = env.float("INBOX_HEARTBEAT_SECONDS", 15.0)
INBOX_RESUME_MARGIN_SECONDS = env.float("INBOX_RESUME_MARGIN_SECONDS", 30.0)
# Where the browser reaches the inbox (the stream server); the demo page points its widget there.
STREAM_PORT = env.int("STREAM_PORT", 8010)
INBOX_PUBLIC_URL = env.str("INBOX_PUBLIC_URL", f"http://127.0.0.1:{STREAM_PORT}")
# Database connections of one stream server process for its reads (its LISTEN connection is one more).
INBOX_STREAM_DB_POOL = env.int("INBOX_STREAM_DB_POOL", 4)
# The stream's LISTEN connection needs a session of its own: behind PgBouncer in transaction mode, point it at
# PostgreSQL itself (a postgres:// URL, multi-host allowed; empty: DATABASE_URL).
INBOX_LISTEN_DATABASE_URL = env.str("INBOX_LISTEN_DATABASE_URL")
# Concurrent streams per inbox token and per recipient across all stream processes (0: no limit); a stream
# beyond them is a 429. A stream's claim lives in Redis for INBOX_STREAM_LEASE_SECONDS and is renewed while open.
INBOX_STREAM_MAX_PER_TOKEN = env.int("INBOX_STREAM_MAX_PER_TOKEN", 5)
INBOX_STREAM_MAX_PER_RECIPIENT = env.int("INBOX_STREAM_MAX_PER_RECIPIENT", 20)
INBOX_STREAM_LEASE_SECONDS = env.float("INBOX_STREAM_LEASE_SECONDS", 60.0)
# Requests per recipient an inbox token speaks for (all of its tokens together), across every process: the
# /inbox/v1/ endpoints and the stream's connection attempts ("20/s", "600/m"); beyond it a 429.
INBOX_TOKEN_RATE_LIMIT = env.str("INBOX_TOKEN_RATE_LIMIT", "20/s")
# The demo page (/inbox/demo/) mints tokens for anyone who opens it: on with DEBUG, or explicitly.
INBOX_DEMO_ENABLED = env.bool("INBOX_DEMO_ENABLED", False)
INBOX_DEMO_USER_ID = env.str("INBOX_DEMO_USER_ID", "u-42")

# Provider credentials and endpoints (one group per provider) and operations settings (logging, metrics,
# tracing, retention) live in their own modules to keep this file readable.
from config.ops_settings import *  # noqa: E402, F403
from config.provider_settings import *  # noqa: E402, F403
