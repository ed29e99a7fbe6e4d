"""The /t/ endpoints: click redirects and the open pixel. Plain Django views: no API key, no DRF, no session.

What the reader came for comes first: the redirect and the pixel answer even when the click or the open cannot
be recorded (the database is away), since a recorded click is a statistic and a link that fails is the
customer's broken email.
"""

from __future__ import annotations

import base64
import logging

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from notifier.tracking.services import BadToken, click_record, click_resolve, open_record, open_resolve

logger = logging.getLogger(__name__)

# The smallest transparent GIF.
PIXEL = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")


@never_cache
@require_GET
def click_view(request: HttpRequest, token: str) -> HttpResponse:
    """Record the click and redirect to the link's original URL; a tampered token is a 400."""
    try:
        delivery_id, url = click_resolve(token)
    except BadToken:
        return HttpResponseBadRequest(b"invalid link", content_type="text/plain")
    try:
        click_record(delivery_id=delivery_id, url=url)
    except DatabaseError as exc:
        logger.warning("click on delivery %s not recorded: %s", delivery_id, type(exc).__name__)
    return HttpResponseRedirect(url)


@never_cache
@require_GET
def open_view(request: HttpRequest, token: str) -> HttpResponse:
    """Record the open and answer a 1x1 transparent GIF; a tampered token is a 400."""
    try:
        delivery_id = open_resolve(token)
    except BadToken:
        return HttpResponseBadRequest(b"invalid pixel", content_type="text/plain")
    try:
        open_record(delivery_id=delivery_id)
    except DatabaseError as exc:
        logger.warning("open of delivery %s not recorded: %s", delivery_id, type(exc).__name__)
    return HttpResponse(PIXEL, content_type="image/gif")
