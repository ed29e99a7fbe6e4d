"""The rules of each notification category (settings.NOTIFIER_CATEGORIES): whether a recipient may switch it
off, whether quiet hours hold it. Read by templates (who may edit which), preferences and the senders.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings

_UNKNOWN: Mapping[str, Any] = {"optional": True, "quiet_hours": True}


def category_config(category: str) -> Mapping[str, Any]:
    """Return the configured rules of a category (to read, not to change); an unknown one is treated as optional.

    No copy: it is asked once per delivery a batch plans.
    """
    config = settings.NOTIFIER_CATEGORIES.get(category)
    return _UNKNOWN if config is None else config


def is_optional(category: str) -> bool:
    """Return whether a recipient may switch this category off."""
    return bool(category_config(category).get("optional", True))
