"""The one-click unsubscribe link (RFC 8058), mounted at the site root: no API key, CSRF-exempt POST."""

from __future__ import annotations

from django.core import signing
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from core.categories import is_optional
from preferences import selectors, services
from projects.scoping import owner_scope


def _page(request: HttpRequest, status: int = 200, **context: object) -> HttpResponse:
    response = render(request, "preferences/unsubscribe.html", context, status=status)
    # The token in the URL identifies the recipient: keep it out of caches and referrers.
    response["Cache-Control"] = "no-store"
    response["Referrer-Policy"] = "no-referrer"
    return response


# Mail clients POST without a CSRF token (RFC 8058 "List-Unsubscribe=One-Click"); the signed token in the URL
# is the authorisation, and the action is idempotent and only ever reduces what is sent.
@csrf_exempt
@require_http_methods(["GET", "HEAD", "POST"])
def unsubscribe_view(request: HttpRequest, token: str) -> HttpResponse:
    """GET shows a confirm page (link scanners must not unsubscribe anyone); POST unsubscribes."""
    try:
        user_id, category, environment_id = services.unsubscribe_token_read(token)
    except signing.BadSignature:
        return _page(request, 404, error="The unsubscribe link is invalid or incomplete.")
    # The link's environment is the page's owner, as an API key's is its request's (projects.scoping): the same
    # user id names another recipient in every other project environment.
    with owner_scope(environment_id):
        return _unsubscribe(request, user_id, category)


def _unsubscribe(request: HttpRequest, user_id: str, category: str) -> HttpResponse:
    """Confirm, or do, the unsubscribe of the recipient `user_id` of the scope's environment from `category`."""
    recipient = selectors.recipient_get(user_id=user_id)
    if recipient is None or not is_optional(category):
        return _page(request, 404, error="There is nothing to unsubscribe from with this link.")
    if request.method != "POST":
        return _page(request, category=category)
    services.category_disable(recipient=recipient, category=category)
    return _page(request, done=True, category=category)


urlpatterns = [path("unsubscribe/<str:token>", unsubscribe_view, name="unsubscribe")]
