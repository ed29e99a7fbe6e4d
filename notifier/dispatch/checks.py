"""Start-up checks of dispatch's settings: the categories' frequency caps and the fan-out pace."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from notifier.deliveries.frequency import validate_caps


@checks.register()
def frequency_caps_valid(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Refuse a NOTIFIER_CATEGORIES whose frequency_cap is not {"max": int > 0, "per_seconds": int > 0}."""
    return [checks.Error(problem, id="notifier.E020") for problem in validate_caps(settings.NOTIFIER_CATEGORIES)]


@checks.register()
def fanout_high_pace_valid(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Refuse a FANOUT_HIGH_PACE that is not "channel=rate;…" (a fan-out would fail on it at every page)."""
    from notifier.dispatch.pace import parse_pace

    try:
        parse_pace(getattr(settings, "FANOUT_HIGH_PACE", "") or "")
    except ValueError as exc:
        return [checks.Error(str(exc), id="notifier.E030")]
    return []
