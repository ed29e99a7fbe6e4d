"""Settings of the provider callbacks (config/provider_settings.py reads them from the environment).

Read at call time (not import time) so tests can override them.
"""

from __future__ import annotations

from django.conf import settings

from core import provider_accounts


def ses_topic_arns() -> list[str]:
    """Return the SNS topic ARNs whose SES notifications are accepted (empty: accept none)."""
    return list(settings.SES_CALLBACK_TOPIC_ARNS)


def sns_cert_url_allowed_hosts() -> list[str]:
    """Return extra hosts ("host" or "host:port") trusted to serve SNS certificates and subscribe URLs.

    Real SNS hosts (`sns.<region>.amazonaws.com`) are always trusted; this is for a stand-in in tests.
    """
    return [h.lower() for h in settings.SNS_CERT_URL_ALLOWED_HOSTS]


def sns_cert_url_allow_http() -> bool:
    """Return whether plain-http certificate and subscribe URLs are allowed (tests only; never in production)."""
    return bool(settings.SNS_CERT_URL_ALLOW_HTTP)


def sns_max_age_seconds() -> float:
    """Return the replay window: a message whose Timestamp is older than this is rejected."""
    return float(settings.SES_CALLBACK_MAX_AGE_SECONDS)


def sns_fetch_timeout_seconds() -> float:
    """Return the timeout for fetching a signing certificate or visiting a SubscribeURL."""
    return float(settings.SNS_HTTP_TIMEOUT_SECONDS)


def sns_cert_cache_seconds() -> float:
    """Return how long a fetched signing certificate is kept in the process cache."""
    return float(settings.SNS_CERT_CACHE_SECONDS)


def sns_cert_cache_max_entries() -> int:
    """Return how many certificate URLs (fetched or failed) the process cache holds at most."""
    return int(getattr(settings, "SNS_CERT_CACHE_MAX_ENTRIES", 32))


def sns_cert_fetches_per_minute() -> float:
    """Return how many certificate URLs not in the cache one process fetches per minute at most."""
    return float(settings.SNS_CERT_FETCHES_PER_MINUTE)


def sns_cert_failure_cache_seconds() -> float:
    """Return how long a certificate URL whose fetch failed is refused without a new fetch."""
    return float(settings.SNS_CERT_FAILURE_CACHE_SECONDS)


def callback_dedup_ttl_seconds() -> int:
    """Return how long processed callback ids are remembered: longer than the replay window, so a replay
    inside the window is always recognised."""
    return int(sns_max_age_seconds() * 2 + 60)


# The provider kinds (core.provider_accounts) whose messages Twilio's status callbacks are about: SMS and WhatsApp.
TWILIO_KINDS = ("twilio", "twilio_whatsapp")


def twilio_auth_tokens() -> list[str]:
    """Return the Twilio auth tokens that may sign status callbacks: the installation's, then each named account's.

    Empty: every callback is rejected. A named account configured with an API key and no auth token has none
    (Twilio signs with the account's auth token), so its callbacks are rejected.
    """
    tokens = [str(settings.TWILIO_AUTH_TOKEN)] if settings.TWILIO_AUTH_TOKEN else []
    try:
        accounts = provider_accounts.configured()
    except provider_accounts.AccountError:
        accounts = {}
    for account in accounts.values():
        token = account.options.get("auth_token") if account.provider in TWILIO_KINDS else None
        if isinstance(token, str) and token and token not in tokens:
            tokens.append(token)
    return tokens


def public_base_url() -> str:
    """Return the externally visible base URL the providers call (Twilio signs the full URL)."""
    return str(settings.PUBLIC_BASE_URL).rstrip("/")


def twilio_callback_urls(full_path: str) -> list[str]:
    """Return the public URLs a Twilio callback to `full_path` may have been signed for.

    PUBLIC_BASE_URL + the request's path and query, and TWILIO_STATUS_CALLBACK_URL (the exact URL given to
    Twilio with each message) when it is set.
    """
    urls = [public_base_url() + full_path]
    configured = str(settings.TWILIO_STATUS_CALLBACK_URL)
    if configured:
        urls.append(configured)
    return urls


def twilio_callback_max_bytes() -> int:
    """Return the largest Twilio callback body read (a status callback is about a kilobyte)."""
    return int(settings.TWILIO_CALLBACK_MAX_BYTES)
