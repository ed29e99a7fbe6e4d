"""Start-up checks: a provider switched on with settings missing stops the process with a clear message."""

from __future__ import annotations

import logging
from typing import Any

from django.core import checks

from channels_app.providers.registry import validate_all

logger = logging.getLogger(__name__)


@checks.register(checks.Tags.compatibility)
def providers_configured(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report every configured provider that cannot be built from its settings (manage.py check, migrate)."""
    return [checks.Error(problem, id="channels_app.E001") for problem in validate_all()]


def check_providers_on_worker_start(**kwargs: Any) -> None:
    """Refuse to start a worker whose providers are misconfigured (celery's worker_init signal)."""
    problems = validate_all()
    if problems:
        message = "Provider configuration is incomplete:\n  " + "\n  ".join(problems)
        logger.critical(message)
        raise SystemExit(message)
