"""ASGI entry point (uvicorn): the live inbox stream, and the rest of the app beside it.

`/inbox/v1/stream` is an async app of its own (notifier/inbox/stream.py: thousands of open streams in one
process); every other path goes to Django, so one server can serve the whole browser inbox (messages, read,
widget.js, the demo page) from one origin. The API proper keeps running under gunicorn (config/wsgi.py).
"""

from __future__ import annotations

import os
import resource
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# Every open stream is a socket: lift the soft open-files limit to the hard one (10,000 streams need more than
# the usual 1,024).
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if _soft < _hard:
    resource.setrlimit(resource.RLIMIT_NOFILE, (_hard, _hard))

from django.core.asgi import get_asgi_application  # noqa: E402

_django = get_asgi_application()

from core.bodies import bounded_asgi  # noqa: E402 - needs Django set up

# Django's ASGI handler spools the whole body before any middleware runs, and decodes the query string with the
# request's charset while it builds the request: bound both in front.
django_application = bounded_asgi(_django)

from notifier.inbox.stream import stream_app  # noqa: E402 - needs Django set up

STREAM_PATH = "/inbox/v1/stream"


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Route the inbox stream to its own app, everything else to Django."""
    if scope["type"] == "http" and scope["path"] == STREAM_PATH:
        await stream_app(scope, receive, send)
        return
    if scope["type"] == "lifespan":
        # Nothing to set up ahead: the stream's LISTEN starts with the first stream.
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    await django_application(scope, receive, send)
