"""What a send may be: the template decides the category, the category caps the priority, the client its categories.

One function, `send_policy`, decides for singles, batch items and campaigns alike, so compliance (opt-out,
quiet hours, digests, List-Unsubscribe) always follows the template's own category and no client can put
marketing on the high-priority (OTP) queues.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from core.errors import ApiError

# Higher rank travels ahead; "high" uses the OTP queues and the rate limiter's high-priority reserve.
PRIORITY_RANK = {"low": 0, "normal": 1, "high": 2}


def category_max_priority(category: str) -> str:
    """Return the highest priority `category` may ask for (`max_priority`, else its default priority)."""
    rules = settings.NOTIFIER_CATEGORIES[category]
    return str(rules.get("max_priority") or rules.get("priority") or "normal")


def send_policy(
    *, client: Any, template_category: str, category: str | None = None, priority: str | None = None
) -> tuple[str, str]:
    """Return the (category, priority) of a send of a template whose category is `template_category`.

    Raises ApiError: 400 `category_mismatch` when the request names another category than the template's,
    403 `category_forbidden` when the client may not send that category, 403 `priority_forbidden` when the
    priority asked for is above the category's `max_priority`.
    """
    if category and category != template_category:
        message = f"The template's category is '{template_category}', not '{category}'; leave category out or match it."
        raise ApiError(400, "category_mismatch", message, {"category": [message]})
    category = template_category
    if category not in settings.NOTIFIER_CATEGORIES:
        message = f"The template's category '{category}' is not configured."
        raise ApiError(400, "invalid", message, {"template": [message]})
    if client.allowed_categories and category not in client.allowed_categories:
        raise ApiError(403, "category_forbidden", f"This API client may not send category '{category}'.")
    priority = priority or str(settings.NOTIFIER_CATEGORIES[category]["priority"])
    ceiling = category_max_priority(category)
    if PRIORITY_RANK[priority] > PRIORITY_RANK[ceiling]:
        message = f"Category '{category}' may use priority '{ceiling}' at most, not '{priority}'."
        raise ApiError(403, "priority_forbidden", message, {"priority": [message]})
    return category, priority
