"""WSGI entry point for gunicorn."""

from __future__ import annotations

import os

import django
from django.urls import get_resolver

from core.heap import freeze_loaded_heap

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)

from core.bodies import bounded_wsgi  # noqa: E402 - needs Django set up
from core.handlers import PathChains  # noqa: E402

# Django decodes the query string with the request's charset while it builds the request, before any
# middleware: a charset it cannot decode with is refused in front. The REST API's paths run a shorter
# middleware chain than the pages' (core/handlers.py).
application = bounded_wsgi(PathChains())
# Every view imported now, not on the first request: then the start-up heap is frozen out of the collector.
get_resolver().url_patterns  # noqa: B018
freeze_loaded_heap()
