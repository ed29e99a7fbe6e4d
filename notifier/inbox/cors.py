"""CORS for the browser inbox: /inbox/v1/ answers cross-origin calls only from INBOX_ALLOWED_ORIGINS."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

PREFIX = "/inbox/v1/"


def allowed_origin(origin: str) -> str | None:
    """Return `origin` if the browser inbox may be called from it, else None ("*" allows any)."""
    if not origin:
        return None
    allowed = settings.INBOX_ALLOWED_ORIGINS
    return origin if origin in allowed or "*" in allowed else None


class InboxCorsMiddleware:
    """Answer preflights and add Access-Control-Allow-Origin on /inbox/v1/ for allowed origins only.

    Tokens travel in the Authorization header or the query, never in cookies, so no credentials mode.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(PREFIX):
            return self.get_response(request)
        origin = allowed_origin(request.headers.get("Origin", ""))
        if request.method == "OPTIONS" and request.headers.get("Access-Control-Request-Method"):
            response = HttpResponse(status=204)
            if origin:
                response["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
                response["Access-Control-Allow-Headers"] = "Authorization, Content-Type, Last-Event-ID"
                response["Access-Control-Max-Age"] = "600"
        else:
            response = self.get_response(request)
        if origin:
            response["Access-Control-Allow-Origin"] = origin
            response["Vary"] = "Origin"
        return response
