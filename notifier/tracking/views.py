"""The /t/ endpoints: click redirects and the open pixel. Plain Django views: no API key, no DRF, no session."""

from __future__ import annotations

import base64

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from notifier.tracking.services import BadToken, click_record, click_resolve, open_record, open_resolve

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
    click_record(delivery_id=delivery_id, url=url)
    return HttpResponseRedirect(url)


@never_cache
@require_GET
def open_view(request: HttpRequest, token: str) -> HttpResponse:
    """Record the open and answer a 1x1 transparent GIF; a tampered token is a 400."""
    try:
        open_record(delivery_id=open_resolve(token))
    except BadToken:
        return HttpResponseBadRequest(b"invalid pixel", content_type="text/plain")
    return HttpResponse(PIXEL, content_type="image/gif")
