"""The path converters of the project's URLs, registered once at start-up (core.apps)."""

from __future__ import annotations

from typing import Any

from django.urls import register_converter

# The largest value of a PostgreSQL bigint: every id and version column holds less.
MAX_ID = 2**63 - 1
# How an `<id:...>` parameter reads in the OpenAPI schema (SPECTACULAR_SETTINGS' PATH_CONVERTER_OVERRIDES).
ID_SCHEMA: dict[str, Any] = {"type": "integer", "format": "int64", "minimum": 0, "maximum": MAX_ID}


class IdConverter:
    """`<id:name>`: a row id or version number, 0 to the largest bigint.

    A longer or larger number names no row: the route does not match and the URL is a 404 like any unknown
    one, before a view does arithmetic with it (the day a delivery id carries) or sends it to PostgreSQL.
    """

    regex = "[0-9]{1,19}"

    def to_python(self, value: str) -> int:
        """Return the id; a ValueError tells Django the route does not match."""
        number = int(value)
        if number > MAX_ID:
            raise ValueError(f"{value} is past the largest bigint")
        return number

    def to_url(self, value: int) -> str:
        """Return the id as it reads in a URL."""
        return str(value)


def register() -> None:
    """Register the converters under their names (`id`), before any URLconf is loaded."""
    register_converter(IdConverter, "id")
