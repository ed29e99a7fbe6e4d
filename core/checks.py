"""Start-up checks of the settings every process needs."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.security)
def secret_key_set(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Refuse to run outside development without a SECRET_KEY (settings refuse first; this guards overrides)."""
    if not getattr(settings, "DEVELOPMENT", False) and not getattr(settings, "_SECRET_KEY_FROM_ENV", True):
        return [checks.Error("SECRET_KEY is not set; set it in the environment.", id="notifier.E001")]
    return []
