"""The inbox in a browser: /inbox/v1/ endpoints authenticated by an inbox token, never by an API key.

The views are the /api/v1 inbox views, bound to the token's user instead of a `user_id` in the path, so
a token can only ever read and mark its own user's inbox. The live stream is an ASGI app of its own
(notifier/inbox/stream.py); the widget script and the demo page are served here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.utils.html import format_html
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import extend_schema
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from core.errors import ApiError
from notifier.inbox.apis import (
    InboxItemArchiveApi,
    InboxItemClickApi,
    InboxItemReadApi,
    InboxItemUnarchiveApi,
    InboxListApi,
    InboxReadAllApi,
    _recipient_or_404,
)
from notifier.inbox.rate_limit import InboxTokenRateThrottle
from notifier.inbox.selectors import inbox_recipient_get
from notifier.inbox.serializers import (
    InboxItemSerializer,
    InboxMeOutput,
    InboxPage,
    InboxQuerySerializer,
    InboxReadAllOutput,
    InboxTokenInput,
    InboxTokenOutput,
)
from notifier.inbox.services import inbox_token_create
from notifier.inbox.tokens import InboxPrincipal, inbox_token_verify
from preferences.selectors import recipient_environment_id
from preferences.services import preference_link, recipient_ensure
from projects.models import DEFAULT_PROJECT_SLUG
from projects.scoping import enter_request_owner, owner_scope
from projects.selectors import ProjectNotFound, environment_of

if TYPE_CHECKING:
    from rest_framework.permissions import _PermissionClass

WIDGET = Path(__file__).resolve().parent / "widget.js"


def token_from(authorization: str, query_token: str) -> str:
    """Return the inbox token of a request: `Authorization: Bearer …`, or `?token=` (EventSource cannot set headers)."""
    scheme, _, value = authorization.partition(" ")
    if scheme == "Bearer" and value.strip():
        return value.strip()
    return query_token


class InboxTokenAuthentication(authentication.BaseAuthentication):
    """Authenticate /inbox/v1/ requests by inbox token only (an API key here is just an invalid token)."""

    def authenticate(self, request: Request) -> tuple[InboxPrincipal, str] | None:
        token = token_from(request.META.get("HTTP_AUTHORIZATION", ""), request.query_params.get("token", ""))
        if not token:
            return None
        principal = inbox_token_verify(token)
        if principal is None:
            raise exceptions.AuthenticationFailed("Invalid or expired inbox token.")
        environment_id = principal.environment_id
        if environment_id is None:  # a token minted before tokens named their owner
            environment_id = recipient_environment_id(recipient_id=principal.recipient_id)
            if environment_id is None:
                raise exceptions.AuthenticationFailed("Invalid or expired inbox token.")
        # The token's recipient's environment is the request's owner, as an API key's is (projects.scoping): the
        # views find the inbox by the token's user id, which names another recipient in every other environment.
        enter_request_owner(environment_id)
        return principal, token

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class InboxTokenScheme(OpenApiAuthenticationExtension):
    """Describe the inbox token in the OpenAPI schema."""

    target_class = InboxTokenAuthentication
    name = "InboxToken"

    def get_security_definition(self, auto_schema: object) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "Inbox token from POST /api/v1/recipients/{user_id}/inbox-token (or `?token=`).",
        }


class IsInboxUser(permissions.BasePermission):
    """Only an inbox token's principal may pass (API clients never reach /inbox/v1/)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.user, InboxPrincipal)


def _principal(request: Request) -> InboxPrincipal:
    """Return the token's principal (IsInboxUser has refused any request without one)."""
    return cast(InboxPrincipal, request.user)


class _TokenBound:
    """Bind an /api/v1 inbox view to the token's user: the user id comes from the token, never the request."""

    authentication_classes: Sequence[type[authentication.BaseAuthentication]] = [InboxTokenAuthentication]
    permission_classes: Sequence[_PermissionClass] = [IsInboxUser]
    # The token's recipient's rate (INBOX_TOKEN_RATE_LIMIT), instead of the per-API-client one.
    throttle_classes: Sequence[type[BaseThrottle]] = [InboxTokenRateThrottle]
    # Not an /api/v1 view: no API-key scope applies (the token is the whole authorization).
    required_scope = None
    required_scopes: dict[str, str] = {}
    # The token names its user, not a path: that user may have been erased since the token was minted.
    error_statuses = {
        404: "The token's recipient is unknown (erased since the token was minted).",
        429: "Over the rate of the token's recipient (INBOX_TOKEN_RATE_LIMIT, all of its tokens); see Retry-After.",
    }


class BrowserInboxListApi(_TokenBound, InboxListApi):
    """GET /inbox/v1/messages: the token user's inbox with its unread count."""

    @extend_schema(
        operation_id="browser_inbox_list",
        summary="List the token user's inbox",
        parameters=[InboxQuerySerializer],
        responses=InboxPage,
    )
    def get(self, request: Request) -> Response:  # type: ignore[override]
        return super().get(request, user_id=_principal(request).user_id)


class BrowserInboxReadApi(_TokenBound, InboxItemReadApi):
    """POST /inbox/v1/messages/{id}/read."""

    @extend_schema(
        operation_id="browser_inbox_item_read",
        summary="Mark one of the token user's items read",
        request=None,
        responses=InboxItemSerializer,
    )
    def post(self, request: Request, delivery_id: int) -> Response:  # type: ignore[override]
        return super().post(request, user_id=_principal(request).user_id, delivery_id=delivery_id)


class BrowserInboxReadAllApi(_TokenBound, InboxReadAllApi):
    """POST /inbox/v1/messages/read-all."""

    @extend_schema(
        operation_id="browser_inbox_read_all",
        summary="Mark the token user's inbox read",
        request=None,
        responses=InboxReadAllOutput,
    )
    def post(self, request: Request) -> Response:  # type: ignore[override]
        return super().post(request, user_id=_principal(request).user_id)


class BrowserInboxArchiveApi(_TokenBound, InboxItemArchiveApi):
    """POST /inbox/v1/messages/{id}/archive."""

    @extend_schema(
        operation_id="browser_inbox_item_archive",
        summary="Archive one of the token user's items",
        request=None,
        responses=InboxItemSerializer,
    )
    def post(self, request: Request, delivery_id: int) -> Response:  # type: ignore[override]
        return super().post(request, user_id=_principal(request).user_id, delivery_id=delivery_id)


class BrowserInboxUnarchiveApi(_TokenBound, InboxItemUnarchiveApi):
    """POST /inbox/v1/messages/{id}/unarchive."""

    @extend_schema(
        operation_id="browser_inbox_item_unarchive",
        summary="Unarchive one of the token user's items",
        request=None,
        responses=InboxItemSerializer,
    )
    def post(self, request: Request, delivery_id: int) -> Response:  # type: ignore[override]
        return super().post(request, user_id=_principal(request).user_id, delivery_id=delivery_id)


class BrowserInboxClickApi(_TokenBound, InboxItemClickApi):
    """POST /inbox/v1/messages/{id}/click: the widget counts a click on the item's action URL before opening it."""

    @extend_schema(
        operation_id="browser_inbox_item_click",
        summary="Record a click on one of the token user's items",
        request=None,
        responses=InboxItemSerializer,
    )
    def post(self, request: Request, delivery_id: int) -> Response:  # type: ignore[override]
        return super().post(request, user_id=_principal(request).user_id, delivery_id=delivery_id)


class BrowserInboxMeApi(_TokenBound, APIView):
    """GET /inbox/v1/me: the token user's id and locale, and a fresh link to their preference center."""

    @extend_schema(operation_id="browser_inbox_me", summary="Describe the token user", responses=InboxMeOutput)
    def get(self, request: Request) -> Response:
        principal = _principal(request)
        recipient = _recipient_or_404(principal.user_id)
        # The link lives as long as the token that asked for it (at least a minute): a page that keeps the
        # widget open mints a new token, and with it a new link, before either runs out.
        ttl = max(60, int(principal.expires - time.time()))
        url, expires_at = preference_link(recipient=recipient, ttl_seconds=ttl)
        data = {
            "user_id": recipient.user_id,
            "locale": recipient.locale,
            "preferences_url": url,
            "preferences_expires_at": expires_at,
        }
        return Response(InboxMeOutput(data).data)


# Recipient.user_id's length: a longer id could never be a recipient, so it is a 400 before anything is created.
USER_ID_MAX_LENGTH = 255


class InboxTokenApi(APIView):
    """POST /api/v1/recipients/{user_id}/inbox-token: mint a short-lived token for that user's inbox.

    A user never seen gets a bare recipient first, as a send to them would: a front end opens the inbox before
    the first notification ever arrives.
    """

    required_scope = "recipients:write"

    @extend_schema(
        operation_id="inbox_token_create",
        summary="Mint an inbox token",
        request=InboxTokenInput,
        responses=InboxTokenOutput,
    )
    def post(self, request: Request, user_id: str) -> Response:
        if len(user_id) > USER_ID_MAX_LENGTH:
            raise ApiError(400, "invalid", "user_id is too long.", {"user_id": ["At most 255 characters."]})
        data = InboxTokenInput(data=request.data or {})
        data.is_valid(raise_exception=True)
        recipient = recipient_ensure(user_id=user_id)
        token, expires_at = inbox_token_create(recipient=recipient, ttl_seconds=data.validated_data["ttl_seconds"])
        return Response(InboxTokenOutput({"token": token, "expires_at": expires_at}).data)


@functools.cache
def _widget_source() -> bytes:
    return WIDGET.read_bytes()


def widget_js(request: HttpRequest) -> HttpResponse:
    """Serve the dependency-free `<notifier-inbox>` web component."""
    response = HttpResponse(_widget_source(), content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = "public, max-age=300"
    response["Access-Control-Allow-Origin"] = "*"  # a public script, like any CDN file
    return response


DEMO_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Notifier inbox demo</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font-family:system-ui,sans-serif;margin:2rem;color:#1a1a1a}} header{{display:flex;
justify-content:space-between;align-items:center;max-width:40rem}}</style></head>
<body><header><h1>Inbox of {user_id}</h1>
<notifier-inbox base-url="{base_url}" token="{token}"{locale}></notifier-inbox></header>
<p>Send this user an in-app notification over the API and it appears here at once.</p>
<script src="{base_url}/inbox/v1/widget.js"></script></body></html>"""


def demo_page(request: HttpRequest) -> HttpResponse:
    """Show the widget for one recipient (the demo user by default). Development only: it mints tokens freely.

    The recipient is the one of `?project=` (`default` unless given), in its live environment (`?mode=test`: its
    test environment): a user id names a recipient in every project environment.
    """
    if not (settings.DEBUG or settings.INBOX_DEMO_ENABLED):
        raise Http404
    mode = "test" if request.GET.get("mode") == "test" else "live"
    try:
        environment = environment_of(project=request.GET.get("project") or DEFAULT_PROJECT_SLUG, mode=mode)
    except ProjectNotFound:
        raise Http404 from None
    with owner_scope(environment.pk):
        recipient = inbox_recipient_get(user_id=request.GET.get("user_id") or settings.INBOX_DEMO_USER_ID)
    if recipient is None:
        raise Http404
    token, _ = inbox_token_create(recipient=recipient, ttl_seconds=settings.INBOX_TOKEN_DEFAULT_TTL_SECONDS)
    base_url = request.build_absolute_uri("/").rstrip("/")
    # ?locale=de shows the widget in another language than the recipient's own.
    locale = format_html(' locale="{}"', request.GET["locale"]) if request.GET.get("locale") else ""
    page = format_html(DEMO_PAGE, user_id=recipient.user_id, base_url=base_url, token=token, locale=locale)
    return HttpResponse(page)
