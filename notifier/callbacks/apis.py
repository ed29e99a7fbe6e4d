"""Provider callback endpoints: no API key (the provider's signature is the credential), CSRF-exempt."""

from __future__ import annotations

import logging
from typing import Any

from django.http import QueryDict
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.bodies import FormParser, json_loads
from core.errors import ApiError
from core.openapi import error_response
from notifier.callbacks import conf
from notifier.callbacks.services import ReplayedCallback, sns_message_handle, twilio_status_handle
from notifier.callbacks.verify import MalformedCallback, VerificationError, verify_twilio_preconditions

logger = logging.getLogger(__name__)
CALLBACK_RESPONSES = {
    200: OpenApiTypes.OBJECT,
    400: error_response(400, "Not a callback of this provider."),
    403: error_response(403, "The signature (or the replay check) failed."),
}
TWILIO_RESPONSES = {**CALLBACK_RESPONSES, 413: error_response(413, "The callback body is larger than allowed.")}


def _reject(exc: Exception, provider: str) -> ApiError:
    """Turn a verification failure into the API error; the reason is logged, not told to the caller."""
    if isinstance(exc, MalformedCallback):
        return ApiError(400, "malformed_callback", f"Malformed callback: {exc}")
    code = "replayed_callback" if isinstance(exc, ReplayedCallback) else "invalid_signature"
    logger.warning("%s callback rejected: %s", provider, exc)
    return ApiError(403, code, "Callback rejected: it could not be verified.")


class SesCallbackApi(APIView):
    """Receive SNS HTTP(S) messages carrying SES events, and SNS subscription confirmations."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]

    @extend_schema(
        operation_id="callback_ses",
        summary="SES events over SNS",
        request=OpenApiTypes.OBJECT,
        responses=CALLBACK_RESPONSES,
        auth=[],
    )
    def post(self, request: Request) -> Response:
        # SNS posts JSON as text/plain, so the raw body is parsed here rather than by DRF's parsers.
        try:
            message = json_loads(request.body)
        except ValueError:
            raise _reject(MalformedCallback("body is not JSON"), "ses") from None
        if not isinstance(message, dict):
            raise _reject(MalformedCallback("body is not a JSON object"), "ses")
        try:
            result = sns_message_handle(message=message)
        except (MalformedCallback, VerificationError) as exc:
            raise _reject(exc, "ses") from None
        return Response(result.as_dict())


class TwilioCallbackApi(APIView):
    """Receive Twilio message status callbacks (form-encoded, signed with X-Twilio-Signature)."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    parser_classes = [FormParser]

    @extend_schema(
        operation_id="callback_twilio",
        summary="Twilio message status",
        request={"application/x-www-form-urlencoded": OpenApiTypes.OBJECT},
        responses=TWILIO_RESPONSES,
        auth=[],
    )
    def post(self, request: Request) -> Response:
        # Nothing of an unsigned or oversized request is read: the signature header and the token are
        # checked first, then the body is read once, bounded, and only parsed to check the signature
        # over its parameters; the callback is applied only after that check passed.
        signature = request.headers.get("X-Twilio-Signature", "")
        try:
            verify_twilio_preconditions(signature=signature)
        except VerificationError as exc:
            raise _reject(exc, "twilio") from None
        raw = _read_bounded_form(request)
        params = QueryDict(raw, mutable=False)
        # Twilio signs the URL it called: the public one (a proxy in front of us may have rewritten ours).
        urls = conf.twilio_callback_urls(request.get_full_path())
        try:
            result = twilio_status_handle(urls=urls, params=params, signature=signature, headers=request.headers)
        except (MalformedCallback, VerificationError) as exc:
            raise _reject(exc, "twilio") from None
        return Response(result.as_dict())


def _read_bounded_form(request: Request) -> bytes:
    """Return the raw form body, read at most once and never past TWILIO_CALLBACK_MAX_BYTES (413 beyond it)."""
    content_type = request.content_type.split(";", 1)[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise _reject(MalformedCallback("body is not form-encoded"), "twilio")
    limit = conf.twilio_callback_max_bytes()
    too_large = ApiError(
        413,
        "payload_too_large",
        f"A Twilio callback body may hold at most {limit} bytes.",
        fields={"body": [f"larger than {limit} bytes"]},
    )
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise _reject(MalformedCallback("Content-Length is not a number"), "twilio") from None
    if declared > limit:
        raise too_large
    raw = request._request.read(limit + 1)
    if len(raw) > limit:
        raise too_large
    try:
        raw.decode("ascii")  # a form-encoded body is ASCII (its values are percent-encoded)
    except UnicodeDecodeError:
        raise _reject(MalformedCallback("body is not form-encoded"), "twilio") from None
    return raw
