"""How the OpenAPI schema describes the API beyond each view's own annotations.

One schema class (REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]) gives every operation its area's tag and every
error status it can answer (AutoSchema.error_statuses: the common ones, 404 for an object in the path, 413
for a body, the HTTP server's own 414 and 431, and what the view declares in `error_statuses`), all in the
one error body of core/errors.py; one post-processing hook describes the tags. Views annotate only what is
theirs: request body, success answer, examples and a unique operation id (`extend_schema`).

What an answer's schema promises is what the answer holds (tests/project/test_schema_answers.py checks every
operation's real answers against it): a field that some answers leave out is declared `required=False`, and is
then not `required` in the schema, read-only or not; a field that can be null is declared `allow_null=True`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import Direction, OpenApiExample, OpenApiResponse
from rest_framework import serializers

# SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"]: one enum for the channel choices, wherever a field offers them.
CHANNEL_CHOICES = list(settings.CHANNELS)

# (path prefix, tag): the first match names an operation's area; more specific prefixes come first.
AREAS: list[tuple[str, str]] = [
    ("/api/v1/notifications", "notifications"),
    ("/api/v1/stats", "statistics"),
    ("/api/v1/templates", "templates"),
    ("/api/v1/layouts", "templates"),
    ("/api/v1/workflows", "workflows"),
    ("/api/v1/promotion", "promotion"),
    ("/api/v1/project", "project"),
    ("/api/v1/recipients/{user_id}/inbox", "inbox"),
    ("/inbox/v1/", "inbox"),
    ("/api/v1/recipients/{user_id}/preference", "preferences"),
    ("/api/v1/recipients", "recipients"),
    ("/api/v1/topics", "topics"),
    ("/api/v1/suppressions", "suppressions"),
    ("/api/v1/campaigns", "campaigns"),
    ("/api/v1/event-endpoint", "status events"),
    ("/api/v1/dead-letters", "dead letters"),
    ("/api/v1/sandbox", "sandbox"),
    ("/callbacks/", "provider callbacks"),
]
TAG_DESCRIPTIONS = {
    "notifications": "Send a notification to a user or a topic, alone or in batches; read, list and cancel them "
    "(scope `send`).",
    "statistics": "Counts of the client's own deliveries per day, channel, status and template (scope `send`).",
    "templates": "Versioned, localized templates and the email layouts around them: create versions, read, preview "
    "(scope `templates`).",
    "workflows": "Versioned multi-step workflows (send, delay, digest, throttle, conditions), run per recipient "
    "by a send with `workflow` (scope `templates` to define them).",
    "promotion": "Promote layouts, templates and workflows from a project's test environment to its live one, "
    "with a diff to review first (scope `templates`, either environment's key).",
    "project": "The calling key's project and environment: its daily quotas per channel, used and left, and its "
    "promotion rule (scope `send`).",
    "recipients": "Recipients' contact data and push devices (scopes `recipients:read` / `recipients:write`).",
    "preferences": "A recipient's channel and category preferences, quiet hours, and links to the preference center.",
    "inbox": "The in-app inbox of a recipient, over an API key (/api/v1) or an inbox token (/inbox/v1).",
    "topics": "Topics and their subscribers (scope `topics`).",
    "suppressions": "The suppression list: addresses nothing is sent to (scope `suppressions`).",
    "campaigns": "Scheduled and recurring sends to a topic (scope `campaigns`).",
    "status events": "The calling service's own endpoint for delivery status events (scope `send`).",
    "dead letters": "Deliveries that exhausted their retries: list, replay, discard (scope `operations`).",
    "sandbox": "What the sandbox providers recorded instead of sending (scope `operations`).",
    "provider callbacks": "Status callbacks from providers; verified by the provider's signature, no API key.",
}


class ErrorDetailSerializer(serializers.Serializer[dict[str, Any]]):
    """What went wrong: a machine code, a sentence for humans and the reasons per field."""

    code = serializers.CharField(help_text="Machine code to switch on: invalid, not_found, scope_missing, …")
    message = serializers.CharField(help_text="A sentence for humans.")
    # The error body's key is "fields"; DRF's metaclass moves declared fields out of the class, so this does not
    # shadow Serializer.fields at runtime, but the stubs cannot see that.
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField()),
        help_text='Reasons per field, by dotted path ("recipient.user_id"); empty when no field is at fault.',
    )


class ErrorSerializer(serializers.Serializer[dict[str, Any]]):
    """The body of every error answer."""

    error = ErrorDetailSerializer()


def _example(name: str, code: str, message: str, fields: dict[str, list[str]] | None = None) -> OpenApiExample:
    return OpenApiExample(name, value={"error": {"code": code, "message": message, "fields": fields or {}}})


ERRORS: dict[int, tuple[str, list[OpenApiExample]]] = {
    400: (
        "Invalid input: the fields at fault and why.",
        [
            _example(
                "invalid",
                "invalid",
                "Invalid input: template: This field is required.",
                {"template": ["This field is required."]},
            ),
            _example(
                "malformed_json", "malformed_json", "JSON parse error - Expecting value: line 1 column 1 (char 0)"
            ),
        ],
    ),
    401: ("No valid key.", [_example("unauthenticated", "unauthenticated", "Invalid API key.")]),
    403: (
        "The key may not do this: a scope, category or priority it does not have.",
        [
            _example(
                "scope_missing",
                "scope_missing",
                "This API key lacks the scope 'templates'.",
                {"scope": ["templates"]},
            )
        ],
    ),
    404: ("No such object.", [_example("not_found", "not_found", "No such notification.")]),
    406: (
        "The Accept header asks for something other than JSON.",
        [_example("not_acceptable", "not_acceptable", "Could not satisfy the request Accept header.")],
    ),
    409: ("The object is in a state that does not allow this.", []),
    413: (
        "The body is larger than MAX_REQUEST_BYTES (5 MiB unless configured); refused before it is read.",
        [_example("payload_too_large", "payload_too_large", "Request body is larger than 5242880 bytes.")],
    ),
    415: (
        "The body's Content-Type is not one the operation reads (JSON unless documented otherwise), or its charset"
        " is one Python cannot decode with.",
        [_example("unsupported_media_type", "unsupported_media_type", 'Unsupported media type "text/plain".')],
    ),
    429: (
        "Over the client's or its project's rate limit, over a daily quota of the project environment "
        "(`quota_exceeded`, naming the channel; Retry-After until midnight UTC), or shed under load; see Retry-After.",
        [
            _example("rate_limited", "rate_limited", "Request was throttled. Expected available in 1 second."),
            _example(
                "quota_exceeded",
                "quota_exceeded",
                "The daily quota of 500 'sms' messages of this project environment is used up; it resets at "
                "2026-12-07T00:00:00Z.",
                {"channel": ["sms"]},
            ),
        ],
    ),
    503: (
        "The database is unavailable; retry after Retry-After.",
        [_example("database_unavailable", "database_unavailable", "The database is unavailable; retry later.")],
    ),
}


# Methods that carry a request body (and so may answer 413).
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# What the HTTP server answers before the app runs (gunicorn's limit_request_line, limit_request_field_size).
SERVER_ERRORS = {
    414: "The request line (method, path and query) is longer than the server reads (4,094 bytes); HTML.",
    431: "A request header is larger than the server reads (8,190 bytes); HTML.",
}


def error_response(status: int, description: str | None = None) -> OpenApiResponse:
    """Return the documented error answer for a status (the one error body, with an example)."""
    default, examples = ERRORS.get(status, ("Error.", []))
    return OpenApiResponse(ErrorSerializer, description=description or default, examples=examples)


class AutoSchema(SpectacularAutoSchema):
    """The project's schema class: area tags and the common error answers on every API operation."""

    def get_tags(self) -> list[str]:
        """Name the operation's area (AREAS); extend_schema(tags=...) on a view overrides this."""
        return [next((tag for prefix, tag in AREAS if self.path.startswith(prefix)), "other")]

    def error_statuses(self) -> dict[int, str | None]:
        """Return the error statuses this operation can answer, with a description of their own or None.

        Every API call: 400, 401, 403, 406, 429, 503; with an object in its path 404; with a body 413 (every
        body is bounded before it is read, core/bodies.py) and 415. Provider callbacks: 413 and 503 besides
        what they declare.
        A view adds its own with a class attribute `error_statuses`: {status: description} for every method,
        or {"get": {status: description}} per method.
        """
        api = self.path.startswith(("/api/v1/", "/inbox/v1/"))
        if not api and not self.path.startswith("/callbacks/"):
            return {}
        codes: dict[int, str | None] = dict.fromkeys([400, 401, 403, 406, 429, 503] if api else [503])
        if api and "{" in self.path:
            codes[404] = None
        if self.method.upper() in BODY_METHODS:
            codes[413] = None
            if api:
                codes[415] = None
        declared: dict[Any, Any] = getattr(self.view, "error_statuses", {})
        for key, value in declared.items():
            if isinstance(key, int):
                codes[key] = value
            elif key.lower() == self.method.lower():
                codes.update(value)
        return codes

    def _map_basic_serializer(self, serializer: Any, direction: Direction) -> dict[str, Any]:
        """Leave out of `required` the read-only fields declared `required=False`: answers may leave them out.

        drf-spectacular lists every read-only field as required (it is in every answer, unless the serializer
        drops it), and DRF makes every read-only field `required=False`; so only a field that says
        `required=False` itself (kept in DRF's `_kwargs`, the arguments it was made with) is optional: the
        fields a workflow send adds, a preview's `sms` (the SMS channel's only).
        """
        schema: dict[str, Any] = super()._map_basic_serializer(serializer, direction)  # type: ignore[no-untyped-call]
        instance = serializer() if isinstance(serializer, type) else serializer
        optional = {
            name
            for name, field in instance.fields.items()
            if field.read_only and getattr(field, "_kwargs", {}).get("required") is False
        }
        required = [name for name in schema.get("required", []) if name not in optional]
        if required:
            schema["required"] = required
        else:
            schema.pop("required", None)
        return schema

    def _get_response_bodies(self, direction: Direction = "response") -> dict[str, Any]:
        """Add the error answers an operation can give to the success answers it declares."""
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        codes = self.error_statuses()
        if not codes:
            return responses
        for code, description in sorted(codes.items()):
            if str(code) not in responses:
                # drf-spectacular leaves this method unannotated.
                responses[str(code)] = self._get_response_for_code(  # type: ignore[no-untyped-call]
                    error_response(code, description), str(code)
                )
        # Answered by the HTTP server (gunicorn) before the app sees the request, in its own HTML.
        for code, description in SERVER_ERRORS.items():
            responses.setdefault(
                str(code), {"description": description, "content": {"text/html": {"schema": {"type": "string"}}}}
            )
        return responses


def describe_tags(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Post-processing hook: list the tags in AREAS order with their descriptions."""
    used = {tag for path in result.get("paths", {}).values() for op in path.values() for tag in op.get("tags", [])}
    ordered = list(dict.fromkeys(tag for _, tag in AREAS))
    result["tags"] = [{"name": tag, "description": TAG_DESCRIPTIONS.get(tag, "")} for tag in ordered if tag in used]
    return result
