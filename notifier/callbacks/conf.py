"""Settings of the provider callbacks, each read from Django settings first, then from the environment.

Read at call time (not import time) so a deployment can set them in settings and tests can override them.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings


def _env_list(name: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def _env_bool(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    return float(value) if value.strip() else default


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


def ses_topic_arns() -> list[str]:
    """Return the SNS topic ARNs whose SES notifications are accepted (empty: accept none)."""
    return list(_setting("SES_CALLBACK_TOPIC_ARNS", None) or _env_list("SES_CALLBACK_TOPIC_ARNS"))


def sns_cert_url_allowed_hosts() -> list[str]:
    """Return extra hosts ("host" or "host:port") trusted to serve SNS certificates and subscribe URLs.

    Real SNS hosts (`sns.<region>.amazonaws.com`) are always trusted; this is for a stand-in in tests.
    """
    return [
        h.lower() for h in (_setting("SNS_CERT_URL_ALLOWED_HOSTS", None) or _env_list("SNS_CERT_URL_ALLOWED_HOSTS"))
    ]


def sns_cert_url_allow_http() -> bool:
    """Return whether plain-http certificate and subscribe URLs are allowed (tests only; never in production)."""
    return bool(_setting("SNS_CERT_URL_ALLOW_HTTP", None) or _env_bool("SNS_CERT_URL_ALLOW_HTTP"))


def sns_max_age_seconds() -> float:
    """Return the replay window: a message whose Timestamp is older than this is rejected."""
    return float(_setting("SES_CALLBACK_MAX_AGE_SECONDS", None) or _env_float("SES_CALLBACK_MAX_AGE_SECONDS", 3600))


def sns_fetch_timeout_seconds() -> float:
    """Return the timeout for fetching a signing certificate or visiting a SubscribeURL."""
    return float(_setting("SNS_HTTP_TIMEOUT_SECONDS", None) or _env_float("SNS_HTTP_TIMEOUT_SECONDS", 5.0))


def sns_cert_cache_seconds() -> float:
    """Return how long a fetched signing certificate is kept in the process cache."""
    return float(_setting("SNS_CERT_CACHE_SECONDS", None) or _env_float("SNS_CERT_CACHE_SECONDS", 24 * 3600))


def callback_dedup_ttl_seconds() -> int:
    """Return how long processed callback ids are remembered: longer than the replay window, so a replay
    inside the window is always recognised."""
    return int(sns_max_age_seconds() * 2 + 60)


def twilio_auth_token() -> str:
    """Return the Twilio auth token that signs status callbacks (empty: every callback is rejected)."""
    return str(_setting("TWILIO_AUTH_TOKEN", None) or os.environ.get("TWILIO_AUTH_TOKEN", ""))


def public_base_url() -> str:
    """Return the externally visible base URL the providers call (Twilio signs the full URL)."""
    return str(_setting("PUBLIC_BASE_URL", None) or os.environ.get("PUBLIC_BASE_URL", "")).rstrip("/")


def twilio_callback_urls(full_path: str) -> list[str]:
    """Return the public URLs a Twilio callback to `full_path` may have been signed for.

    PUBLIC_BASE_URL + the request's path and query, and TWILIO_STATUS_CALLBACK_URL (the exact URL given to
    Twilio with each message) when it is set.
    """
    urls = [public_base_url() + full_path]
    configured = str(_setting("TWILIO_STATUS_CALLBACK_URL", None) or os.environ.get("TWILIO_STATUS_CALLBACK_URL", ""))
    if configured:
        urls.append(configured)
    return urls
