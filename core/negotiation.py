"""Content negotiation for an API that answers JSON only."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

# Accept headers that any JSON answer satisfies: what clients send nearly always (no header is DRF's */*; an empty
# one is a 406 there, and here too, by DRF's own path).
_ANY_JSON = frozenset({"*/*", "application/json", "application/*"})


class JsonFirstNegotiation(DefaultContentNegotiation):
    """DRF's negotiation, with the common case answered without parsing the Accept header.

    A view rendering JSON alone, asked for JSON or anything, gets its renderer at once: DRF parses the header and
    matches media types for every request, about a fiftieth of the send endpoint's CPU. Any other Accept header
    (a format suffix, `text/html`, a list with qualities) takes DRF's own path, 406 included.
    """

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str] | Any:
        """Return the only renderer for a plain Accept; otherwise what DRF would."""
        renderers = list(renderers)
        if len(renderers) == 1 and format_suffix is None:
            accept = request.META.get("HTTP_ACCEPT", "*/*")
            renderer = renderers[0]
            override = self.settings.URL_FORMAT_OVERRIDE
            asked_format = override and override in request.query_params
            if accept in _ANY_JSON and renderer.media_type == "application/json" and not asked_format:
                return renderer, renderer.media_type
        return super().select_renderer(request, renderers, format_suffix)
