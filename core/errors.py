"""The API's error body and the DRF exception handler that produces it.

Every error answers `{"error": {"code", "message", "fields"}}`: a machine code callers can switch on, a
sentence for humans, and per-field reasons for validation errors. Known conditions (database down, oversized
body) get their own status instead of a 500.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import page_not_found
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

logger = logging.getLogger(__name__)


class ApiError(exceptions.APIException):
    """An error with an explicit status, machine code, message and optional field reasons."""

    def __init__(self, status_code: int, code: str, message: str, fields: dict[str, Any] | None = None) -> None:
        super().__init__(detail=message, code=code)
        self.status_code = status_code
        self.error_code = code
        self.message = message
        self.fields = fields or {}


def retry_after_seconds(wait: float) -> int:
    """Return the Retry-After of a wait: whole seconds, rounded up and at least 1 (never back too early)."""
    return max(1, math.ceil(wait))


def throttled_body(wait: float) -> dict[str, Any]:
    """Return the 429 `rate_limited` body of a request refused for its rate, as DRF words it."""
    return error_body("rate_limited", str(exceptions.Throttled(wait=retry_after_seconds(wait)).detail))


def error_body(code: str, message: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the error body every endpoint uses."""
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """Flatten DRF's nested error detail into {"a.b.0.c": ["reason", ...]}."""
    out: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = key if key != "non_field_errors" else "non_field_errors"
            out.update(_flatten(value, f"{prefix}.{name}" if prefix else str(name)))
    elif isinstance(detail, list) and detail and not all(isinstance(d, str) for d in detail):
        for index, value in enumerate(detail):
            if value:
                out.update(_flatten(value, f"{prefix}.{index}" if prefix else str(index)))
    elif isinstance(detail, list):
        out[prefix or "non_field_errors"] = [str(d) for d in detail]
    else:
        out[prefix or "non_field_errors"] = [str(detail)]
    return out


def validation_error(detail: Any) -> dict[str, Any]:
    """Return the `error` of a validation failure: code "invalid", the first reason as the message, every field's.

    What a 400 answers, and what a batch answers for each item it refused (items fail alone, in the same words).
    """
    fields = _flatten(detail)
    first = next(iter(fields.items()), ("", [""]))
    message = f"Invalid input: {first[0]}: {first[1][0]}" if first[0] else "Invalid input."
    return {"code": "invalid", "message": message, "fields": fields}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Render every API exception in the common error format."""
    if isinstance(exc, ApiError):
        headers = {}
        # DRF's convention for "come back later" (as on Throttled): a `wait` in seconds becomes Retry-After.
        wait = getattr(exc, "wait", None)
        if wait is not None:
            headers["Retry-After"] = str(math.ceil(wait))
        return Response(error_body(exc.error_code, exc.message, exc.fields), status=exc.status_code, headers=headers)
    if isinstance(exc, RequestDataTooBig):
        return Response(error_body("payload_too_large", "Request body is too large."), status=413)
    if isinstance(exc, OperationalError | InterfaceError) or type(exc) is DatabaseError:
        logger.error("database unavailable: %s", type(exc).__name__)
        return Response(
            error_body("database_unavailable", "The database is unavailable; retry later."),
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": "5"},
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = {"error": validation_error(exc.detail)}
        return response
    codes = {
        exceptions.NotAuthenticated: "unauthenticated",
        exceptions.AuthenticationFailed: "unauthenticated",
        exceptions.PermissionDenied: "forbidden",
        exceptions.NotFound: "not_found",
        exceptions.MethodNotAllowed: "method_not_allowed",
        exceptions.ParseError: "malformed_json",
        exceptions.UnsupportedMediaType: "unsupported_media_type",
        exceptions.NotAcceptable: "not_acceptable",
        exceptions.Throttled: "rate_limited",
    }
    code = next((c for klass, c in codes.items() if isinstance(exc, klass)), "error")
    detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
    response.data = error_body(code, str(detail))
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        response.status_code = status.HTTP_401_UNAUTHORIZED
    # DRF sets Throttled.wait in __init__; its stubs do not declare the attribute, hence getattr.
    wait = getattr(exc, "wait", None) if isinstance(exc, exceptions.Throttled) else None
    if wait is not None:
        # DRF writes whole seconds rounded down ("0" for a 0.3 s wait); a client must not come back too early.
        response["Retry-After"] = str(retry_after_seconds(wait))
    return response


# Where a URL that matches no route is answered in the API's error body (elsewhere: Django's HTML page).
JSON_PREFIXES = ("/api/", "/inbox/v1/", "/callbacks/")


def not_found_view(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Answer a URL that matches no route (handler404): the error body under the API's prefixes."""
    if request.path.startswith(JSON_PREFIXES):
        return JsonResponse(error_body("not_found", "Not found."), status=404)
    return page_not_found(request, exception or Http404())
