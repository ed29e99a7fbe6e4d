"""Provider credentials and endpoints, one documented group of environment variables per provider.

A provider is used only when it is listed in `<CHANNEL>_PROVIDERS` (config/settings.py); its adapter's
`from_settings()` then checks that the variables it needs are set and names the first one missing.
Every endpoint can be overridden, so the real SDK can be pointed at a local stand-in (tests/stubs).
See docs/providers.md for each provider's error classification and the failover policy.
"""

from __future__ import annotations

from core.env import env as _env

# --- Email, shared by SES and SMTP ------------------------------------------------------------------
# The From header of every email ("Notifier <no-reply@example.com>"); a message may override it with
# meta["from_email"]. Required by both email providers.
EMAIL_FROM = _env.str("EMAIL_FROM")
# Optional Reply-To for every email.
EMAIL_REPLY_TO = _env.str("EMAIL_REPLY_TO")

# --- FCM (push), firebase-admin ---------------------------------------------------------------------
# Path to the Firebase service-account JSON file (falls back to GOOGLE_APPLICATION_CREDENTIALS).
FCM_CREDENTIALS_FILE = _env.str("FCM_CREDENTIALS_FILE") or _env.str("GOOGLE_APPLICATION_CREDENTIALS")
# Project id; defaults to the project_id inside the service-account file.
FCM_PROJECT_ID = _env.str("FCM_PROJECT_ID")
# Base URL of the FCM HTTP v1 API (a stand-in in tests); messages go to <base>/v1/projects/<id>/messages:send.
FCM_ENDPOINT = _env.str("FCM_ENDPOINT", "https://fcm.googleapis.com")
# OAuth token endpoint; overrides the token_uri of the service-account file (a stand-in in tests).
FCM_TOKEN_URI = _env.str("FCM_TOKEN_URI")
# Seconds before one FCM call is abandoned (connect and read).
FCM_TIMEOUT_SECONDS = _env.float("FCM_TIMEOUT_SECONDS", 10.0)
# Messages per send_each call (FCM's limit is 500).
FCM_BATCH_SIZE = min(500, _env.int("FCM_BATCH_SIZE", 500))

# --- AWS, shared by SES and SNS ---------------------------------------------------------------------
# Region and credentials; empty credentials mean boto3's default chain (instance role, ~/.aws, AWS_* env).
AWS_REGION = _env.str("AWS_REGION") or _env.str("AWS_DEFAULT_REGION", "us-east-1")
AWS_ACCESS_KEY_ID = _env.str("AWS_ACCESS_KEY_ID")
AWS_SECRET_ACCESS_KEY = _env.str("AWS_SECRET_ACCESS_KEY")
AWS_SESSION_TOKEN = _env.str("AWS_SESSION_TOKEN")
# Seconds to connect and to wait for an answer from SES/SNS.
AWS_CONNECT_TIMEOUT_SECONDS = _env.float("AWS_CONNECT_TIMEOUT_SECONDS", 3.0)
AWS_READ_TIMEOUT_SECONDS = _env.float("AWS_READ_TIMEOUT_SECONDS", 10.0)

# --- SES v2 (email) ---------------------------------------------------------------------------------
# Region (defaults to AWS_REGION) and endpoint override (moto's server in tests).
SES_REGION = _env.str("SES_REGION") or AWS_REGION
SES_ENDPOINT_URL = _env.str("SES_ENDPOINT_URL")
# Configuration set that publishes bounce/complaint/delivery events to the SNS topic behind /callbacks/ses.
SES_CONFIGURATION_SET = _env.str("SES_CONFIGURATION_SET")

# --- SMTP (email), Django's SMTP backend ------------------------------------------------------------
# Host is required to use SMTP; STARTTLS with SMTP_USE_TLS, implicit TLS with SMTP_USE_SSL (not both).
SMTP_HOST = _env.str("SMTP_HOST")
SMTP_PORT = _env.int("SMTP_PORT", 587)
SMTP_USERNAME = _env.str("SMTP_USERNAME")
SMTP_PASSWORD = _env.str("SMTP_PASSWORD")
SMTP_USE_TLS = _env.bool("SMTP_USE_TLS", False)
SMTP_USE_SSL = _env.bool("SMTP_USE_SSL", False)
SMTP_TIMEOUT_SECONDS = _env.float("SMTP_TIMEOUT_SECONDS", 10.0)
# Open SMTP connections kept per worker process (each carries one message at a time).
SMTP_POOL_SIZE = _env.int("SMTP_POOL_SIZE", 4)
# A pooled connection idle longer than this is checked with NOOP before use (servers drop idle clients).
SMTP_IDLE_CHECK_SECONDS = _env.float("SMTP_IDLE_CHECK_SECONDS", 15.0)

# --- Twilio (SMS) -----------------------------------------------------------------------------------
# Account SID and auth token are required; an API key (SID + secret) may replace the auth token.
TWILIO_ACCOUNT_SID = _env.str("TWILIO_ACCOUNT_SID")
TWILIO_AUTH_TOKEN = _env.str("TWILIO_AUTH_TOKEN")
TWILIO_API_KEY_SID = _env.str("TWILIO_API_KEY_SID")
TWILIO_API_KEY_SECRET = _env.str("TWILIO_API_KEY_SECRET")
# Sender: a Messaging Service SID (preferred: it handles number pools and STOP) or a From number (E.164).
TWILIO_MESSAGING_SERVICE_SID = _env.str("TWILIO_MESSAGING_SERVICE_SID")
TWILIO_FROM_NUMBER = _env.str("TWILIO_FROM_NUMBER")
# Replaces https://api.twilio.com (a stand-in in tests); empty means Twilio itself.
TWILIO_BASE_URL = _env.str("TWILIO_BASE_URL")
# Where Twilio posts status callbacks (this service's /callbacks/twilio, public URL); empty means none.
TWILIO_STATUS_CALLBACK_URL = _env.str("TWILIO_STATUS_CALLBACK_URL")
TWILIO_TIMEOUT_SECONDS = _env.float("TWILIO_TIMEOUT_SECONDS", 10.0)

# --- Amazon SNS (SMS, second provider) --------------------------------------------------------------
SNS_REGION = _env.str("SNS_REGION") or AWS_REGION
SNS_ENDPOINT_URL = _env.str("SNS_ENDPOINT_URL")
# "Transactional" (OTPs, alerts: higher delivery priority) or "Promotional".
SNS_SMS_TYPE = _env.str("SNS_SMS_TYPE", "Transactional")
# Optional alphanumeric sender id and origination number (country rules apply).
SNS_SENDER_ID = _env.str("SNS_SENDER_ID")
SNS_ORIGINATION_NUMBER = _env.str("SNS_ORIGINATION_NUMBER")

# --- Provider accounts for projects -----------------------------------------------------------------
# Named accounts a project may send through instead of the installation's providers (JSON object: name ->
# {"provider": "ses" | "smtp" | "twilio" | "sns", and that provider's settings}; docs/configuration.md).
# Credentials live here, in the environment; a project stores only the names it uses.
PROVIDER_ACCOUNTS: dict[str, dict[str, object]] = _env.json("PROVIDER_ACCOUNTS", {})

# --- Webhooks ---------------------------------------------------------------------------------------
# Default Standard Webhooks secret ("whsec_<base64>") for endpoints without their own secret.
WEBHOOK_SIGNING_SECRET = _env.str("WEBHOOK_SIGNING_SECRET")
WEBHOOK_CONNECT_TIMEOUT_SECONDS = _env.float("WEBHOOK_CONNECT_TIMEOUT_SECONDS", 3.0)
WEBHOOK_READ_TIMEOUT_SECONDS = _env.float("WEBHOOK_READ_TIMEOUT_SECONDS", 10.0)
WEBHOOK_USER_AGENT = _env.str("WEBHOOK_USER_AGENT", "Notifier-Webhooks/1.0")
# Response bytes read from a receiver; the rest is discarded with its connection.
WEBHOOK_MAX_RESPONSE_BYTES = _env.int("WEBHOOK_MAX_RESPONSE_BYTES", 65536)

# --- Provider callbacks (notifier/callbacks) ---------------------------------------------------------
# SNS topic ARNs whose SES notifications /callbacks/ses accepts (comma-separated; empty: none).
SES_CALLBACK_TOPIC_ARNS = _env.list("SES_CALLBACK_TOPIC_ARNS")
# The replay window: a message whose Timestamp is older than this is rejected.
SES_CALLBACK_MAX_AGE_SECONDS = _env.float("SES_CALLBACK_MAX_AGE_SECONDS", 3600.0)
# Extra hosts ("host" or "host:port") trusted to serve SNS certificates and subscribe URLs (a stand-in in tests);
# real SNS hosts are always trusted. Plain-http URLs only with SNS_CERT_URL_ALLOW_HTTP (tests only).
SNS_CERT_URL_ALLOWED_HOSTS = _env.list("SNS_CERT_URL_ALLOWED_HOSTS")
SNS_CERT_URL_ALLOW_HTTP = _env.bool("SNS_CERT_URL_ALLOW_HTTP", False)
# Timeout for fetching a signing certificate or visiting a SubscribeURL, and how long a certificate is cached.
SNS_HTTP_TIMEOUT_SECONDS = _env.float("SNS_HTTP_TIMEOUT_SECONDS", 5.0)
SNS_CERT_CACHE_SECONDS = _env.float("SNS_CERT_CACHE_SECONDS", 24 * 3600.0)
# The certificate URL arrives in unauthenticated messages: the process cache holds this many URLs at most,
# a URL whose fetch failed is refused without a new fetch for SNS_CERT_FAILURE_CACHE_SECONDS, and at most
# SNS_CERT_FETCHES_PER_MINUTE URLs not in the cache are fetched per process per minute (the rest: 403).
SNS_CERT_CACHE_MAX_ENTRIES = _env.int("SNS_CERT_CACHE_MAX_ENTRIES", 32)
SNS_CERT_FAILURE_CACHE_SECONDS = _env.float("SNS_CERT_FAILURE_CACHE_SECONDS", 300.0)
SNS_CERT_FETCHES_PER_MINUTE = _env.float("SNS_CERT_FETCHES_PER_MINUTE", 6.0)
# Largest Twilio status callback body read (bytes); a larger one is answered 413 before it is parsed.
TWILIO_CALLBACK_MAX_BYTES = _env.int("TWILIO_CALLBACK_MAX_BYTES", 16384)
