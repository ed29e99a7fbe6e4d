"""Shared values for the stand-ins, and a helper to point Django settings at them."""

from __future__ import annotations

import base64
import os
from typing import Any

WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"notifier-test-webhook-secret-32b").decode()
EMAIL_FROM = "Notifier <no-reply@notifier.test>"
SMS_FROM = "+15005550006"


def configure_settings(settings: Any, env: dict[str, str]) -> None:
    """Apply stand-in environment variables to Django settings by re-reading config.provider_settings."""
    import importlib

    import config.provider_settings as provider_settings

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        module = importlib.reload(provider_settings)
        values = {name: getattr(module, name) for name in dir(module) if name.isupper()}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        importlib.reload(provider_settings)
    for name, value in values.items():
        setattr(settings, name, value)
