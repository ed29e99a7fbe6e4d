"""The rules of each notification category (settings.NOTIFIER_CATEGORIES): whether a recipient may switch it
off, whether quiet hours hold it. Read by templates (who may edit which), preferences and the senders.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings


def category_config(category: str) -> dict[str, Any]:
    """Return the configured rules of a category; an unknown category is treated as optional."""
    config = settings.NOTIFIER_CATEGORIES.get(category)
    if config is None:
        return {"optional": True, "quiet_hours": True}
    return dict(config)


def is_optional(category: str) -> bool:
    """Return whether a recipient may switch this category off."""
    return bool(category_config(category).get("optional", True))
