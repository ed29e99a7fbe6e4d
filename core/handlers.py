"""The WSGI application: the REST API's paths served through a middleware chain of their own.

Django builds one middleware chain for every path. Half of ours is for pages (the admin, the preference
centre): sessions, CSRF, users, messages, static files, frame options. A request with an API key has no
session or form, and on the send endpoint that half was about a twentieth of the API's CPU. Requests under
`API_PATH_PREFIX` therefore run `settings.MIDDLEWARE` without `PAGE_MIDDLEWARE`; every other path runs the whole
chain. Both chains are built by Django's own handler from the same list, so what is added to MIDDLEWARE at start-up
(the tracing middleware) is in both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler

StartResponse = Callable[..., Any]


class _ChainHandler(WSGIHandler):
    """Django's WSGI handler over a given middleware list instead of settings.MIDDLEWARE."""

    def __init__(self, middleware: list[str]) -> None:
        self._middleware_paths = middleware
        super().__init__()

    def load_middleware(self, is_async: bool = False) -> None:
        """Build the chain from this handler's list (Django reads the setting; it is swapped only while loading)."""
        whole = settings.MIDDLEWARE
        settings.MIDDLEWARE = self._middleware_paths
        try:
            super().load_middleware(is_async)
        finally:
            settings.MIDDLEWARE = whole


def api_middleware() -> list[str]:
    """Return the API's chain: settings.MIDDLEWARE in its order, without the pages' middleware."""
    pages = set(settings.PAGE_MIDDLEWARE)
    return [path for path in settings.MIDDLEWARE if path not in pages]


class PathChains:
    """A WSGI application: `API_PATH_PREFIX` through the API's chain, everything else through the whole one."""

    def __init__(self) -> None:
        self.prefix: str = settings.API_PATH_PREFIX
        self.api = _ChainHandler(api_middleware())
        self.pages = _ChainHandler(list(settings.MIDDLEWARE))

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """Serve the request through the chain its path belongs to."""
        handler = self.api if environ.get("PATH_INFO", "").startswith(self.prefix) else self.pages
        return handler(environ, start_response)
