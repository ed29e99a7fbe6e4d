"""The keys callers name objects by (templates, layouts, workflows, topics): one rule for all of them.

A key is 1 to 128 letters, digits, `-` or `_`: it fits the `key` column of every such table (a slug of 128)
and a URL's path segment as it is. A longer one is a 400 naming the field, never a PostgreSQL error.
"""

from __future__ import annotations

import re
from typing import Any

from rest_framework.exceptions import ValidationError

KEY_MAX_LENGTH = 128
# The rule as a regular expression to build on (a pinned `key@3` in a send's `template` and `workflow`).
KEY = rf"[-a-zA-Z0-9_]{{1,{KEY_MAX_LENGTH}}}"
KEY_PATTERN = re.compile(rf"^{KEY}$")
KEY_RULE = f"must be 1-{KEY_MAX_LENGTH} letters, digits, '-' or '_'"


def key_errors(key: Any, *, field: str = "key") -> dict[str, list[str]]:
    """Return `{field: [KEY_RULE]}` when `key` breaks the rule, else an empty dict."""
    if isinstance(key, str) and KEY_PATTERN.match(key):
        return {}
    return {field: [KEY_RULE]}


def require_key(key: Any, *, field: str = "key") -> None:
    """Raise the 400 naming `field` (a ValidationError) when `key` breaks the rule."""
    errors = key_errors(key, field=field)
    if errors:
        raise ValidationError(errors)
