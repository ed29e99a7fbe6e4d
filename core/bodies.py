"""Request bodies and URLs bounded before they are read: size, JSON nesting, text PostgreSQL cannot store.

Every body is refused with a 413 `payload_too_large` when it is larger than `MAX_REQUEST_BYTES`
(DATA_UPLOAD_MAX_MEMORY_SIZE), before any of it is read: BodyLimitMiddleware checks the Content-Length of
every request (API, callbacks, browser inbox, pages), and reads a body sent without one (chunked) only up to
the limit. Under ASGI Django spools the whole body before any middleware runs, so `bounded_asgi` does the
same in front of it. The parsers (JSONParser, FormParser) read at most the limit too, whoever calls them.

A JSON body nested deeper than MAX_JSON_DEPTH is a 400 `malformed_json`: deeper values reach Python's
recursion limit in the parser, in `json.dumps` and in PostgreSQL's jsonb. A string holding a NUL or a lone
surrogate (`"\\ud800"`), which PostgreSQL cannot store, and a number out of range (`1e999`, which Python reads
as infinity and jsonb refuses) are a 400 `invalid` naming the body's field. A path holding a NUL or another
control character is a 404 (it names nothing); a query parameter holding one is a 400 naming the parameter.

A `charset` in Content-Type that Python cannot decode with is a 415 `unsupported_media_type` on every URL,
answered in front of Django (`bounded_wsgi`, `bounded_asgi`): Django takes any codec `codecs.lookup` finds
(`rot13`, `bz2_codec`) and decodes the query string with it while it builds the request, before any middleware
runs, so such a request was a 500 on every URL. A name Python does not know at all Django ignores, decoding
as UTF-8 what the client says is something else: it is refused too, rather than guessed at.
"""

from __future__ import annotations

import codecs
import io
import json
import math
import re
from collections.abc import Awaitable, Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.utils.http import parse_header_parameters
from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

    from core.errors import ApiError

# How deep a JSON body may nest (an object or array inside another counts one level; a flat object is 1).
MAX_JSON_DEPTH = 64
# Lone surrogates: JSON's \\ud800 escapes decode to them; UTF-8 (and so PostgreSQL) has no encoding for them.
_SURROGATE = re.compile("[\ud800-\udfff]")
# Characters refused in a URL: C0 controls and DEL. They name no object and PostgreSQL stores no NUL.
_CONTROL = re.compile("[\x00-\x1f\x7f]")
# Escapes in JSON text that can parse to a string PostgreSQL cannot store: a NUL or a surrogate (a valid
# escaped pair is caught too, and cleared by the walk). Searched only in a text that holds a `\u` at all.
_UNSTORABLE_ESCAPE = re.compile(r"\\u0000|\\u[dD][89a-fA-F]")
# The DRF request attribute the items parser sets: False when the body's text cannot hold such a value.
_VALUES_TO_CHECK = "notifier_values_to_check"
NUL_MESSAGE = "Null characters are not allowed."
SURROGATE_MESSAGE = "Lone surrogates (\\ud800-\\udfff) are not valid Unicode text."
NUMBER_MESSAGE = "Numbers must be finite and within the range of a double."
# Python's own codecs that are text encodings but no character set a request is written in (the "Python
# Specific Encodings" of the codecs module): their decoders raise errors Django does not catch.
_PYTHON_ONLY_CODECS = frozenset(
    {"idna", "mbcs", "oem", "palmos", "punycode", "raw-unicode-escape", "undefined", "unicode-escape"}
)
# How much of a refused charset the error message repeats.
_CHARSET_ECHO = 64


def max_body_bytes() -> int:
    """Return the largest request body accepted (MAX_REQUEST_BYTES)."""
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0) or 5 * 1024 * 1024


def _errors() -> ModuleType:
    # core.errors imports DRF's views, which import DEFAULT_PARSER_CLASSES, which are in this module.
    from core import errors

    return errors


def _api_error() -> type[ApiError]:
    cls: type[ApiError] = _errors().ApiError
    return cls


def error_body(code: str, message: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the API's error body (core.errors.error_body)."""
    return dict(_errors().error_body(code, message, fields))


def too_large() -> ApiError:
    """Return the 413 of a body over the limit."""
    ApiError = _api_error()
    return ApiError(413, "payload_too_large", f"Request body is larger than {max_body_bytes()} bytes.")


def _answer(status: int, body: dict[str, Any]) -> JsonResponse:
    # Answered ahead of CommonMiddleware, which would set the length: without one the server would chunk it.
    response = JsonResponse(body, status=status)
    response["Content-Length"] = str(len(response.content))
    return response


def _too_large_response() -> JsonResponse:
    return _answer(413, error_body(too_large().error_code, too_large().message))


# --- Content-Type ---------------------------------------------------------------------------------------


def charset_problem(content_type: str) -> str | None:
    """Return why the `charset` of a Content-Type header cannot decode a request, or None if it can or names none."""
    if "charset" not in content_type.lower():
        return None  # most requests: no header parse
    charset = parse_header_parameters(content_type)[1].get("charset")
    if charset is None:
        return None
    problem = f'Unsupported charset "{charset[:_CHARSET_ECHO]}" in the Content-Type header.'
    try:
        name = codecs.lookup(charset).name
        # Refuses the codecs that are no text encoding (bz2_codec, rot13), as DRF's parsers do.
        "".encode(charset)
    except (LookupError, ValueError):  # ValueError: a name with a NUL; UnicodeError: the `undefined` codec
        return problem
    return problem if name in _PYTHON_ONLY_CODECS else None


def _unsupported_charset_body(problem: str) -> bytes:
    return json.dumps(error_body("unsupported_media_type", problem)).encode()


# --- JSON -------------------------------------------------------------------------------------------------


class JsonTooDeep(ValueError):
    """A JSON document nested deeper than allowed."""

    def __init__(self, limit: int = MAX_JSON_DEPTH) -> None:
        super().__init__(f"JSON nested deeper than {limit} levels.")


def json_depth(value: Any) -> int:
    """Return how deep a parsed JSON value nests (a scalar is 0, a flat object or array 1); walked level by level.

    Each level's children are gathered with one `extend` per container (no generator or tuple per child): a
    batch item is walked in about a quarter of the time a stack of (value, depth) pairs took.
    """
    depth = 0
    level = [value]
    while True:
        children: list[Any] = []
        found = False
        for item in level:
            if isinstance(item, dict):
                found = True
                children.extend(item.values())
            elif isinstance(item, list):
                found = True
                children.extend(item)
        if not found:
            return depth
        depth += 1
        level = children


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return NUL_MESSAGE
    if _SURROGATE.search(text):
        return SURROGATE_MESSAGE
    return None


def _printable(name: str) -> str:
    """Return a field name fit to echo in an error body (the name itself may hold the bad character)."""
    return _SURROGATE.sub("\ufffd", name.replace("\x00", "\ufffd"))


def value_problems(value: Any, field: str = "") -> dict[str, list[str]]:
    """Return {field: [reason]} for what PostgreSQL cannot store in a parsed JSON value, by top-level field.

    Strings (an object's keys too) holding a NUL or a lone surrogate, and non-finite numbers. Reported under
    the name of the body's top-level field the problem is in (`field` for a scalar or a list body).
    """
    found: dict[str, list[str]] = {}
    if isinstance(value, dict):
        tops = [(_printable(str(key)), key, child) for key, child in value.items()]
    else:
        tops = [(field or "non_field_errors", None, value)]
    for name, key, top in tops:
        pending = [top] if key is None else [key, top]
        while pending:
            item = pending.pop()
            problem = None
            if isinstance(item, str):
                problem = _text_problem(item)
            elif isinstance(item, float) and not math.isfinite(item):
                problem = NUMBER_MESSAGE
            elif isinstance(item, dict):
                pending.extend(item.keys())
                pending.extend(item.values())
            elif isinstance(item, list):
                pending.extend(item)
            if problem:
                found[name] = [problem]
                break
    return found


def may_be_unstorable(text: str, *, overflowed: bool = False) -> bool:
    """Return whether JSON `text` may hold a value PostgreSQL cannot store; False proves it holds none.

    A text without a NUL, a surrogate or their escapes needs no walk of its values: a few searches in C
    instead of a visit of every value in Python. Numbers are not in the text's search: `overflowed` says
    whether its parse met one past a double's range (`json_loads_checked`).
    """
    if overflowed or "\x00" in text:
        return True
    # A str decoded from UTF-8 holds no surrogate; an ASCII one (a flag CPython keeps) no literal one at all.
    if not text.isascii() and _SURROGATE.search(text) is not None:
        return True
    return "\\u" in text and _UNSTORABLE_ESCAPE.search(text) is not None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class _FloatWatch:
    """A JSON parser's float hook that notes a number past a double's range (it parses to an infinity)."""

    __slots__ = ("overflowed",)

    def __init__(self) -> None:
        self.overflowed = False

    def __call__(self, token: str) -> float:
        value = float(token)
        if math.isinf(value):
            self.overflowed = True
        return value


def json_loads(raw: bytes | str, *, max_depth: int | None = MAX_JSON_DEPTH) -> Any:
    """Parse JSON text, refusing NaN/Infinity and, unless `max_depth` is None, nesting deeper than it.

    Raises ValueError (JsonTooDeep for the nesting; past Python's recursion limit too, with any `max_depth`).
    """
    return _loads(raw, max_depth, float)


def json_loads_checked(text: str, *, max_depth: int | None = MAX_JSON_DEPTH) -> tuple[Any, bool]:
    """Parse JSON text as `json_loads` does; also return whether it may hold a value PostgreSQL cannot store.

    False proves it holds none (see `may_be_unstorable`); True asks for a walk of its values.
    """
    watch = _FloatWatch()
    value = _loads(text, max_depth, watch)
    return value, may_be_unstorable(text, overflowed=watch.overflowed)


def _loads(raw: bytes | str, max_depth: int | None, parse_float: Callable[[str], float]) -> Any:
    try:
        # parse_float=float keeps the decoder's own C path; a hook is called once per float token (rare here).
        value = json.loads(raw, parse_constant=_refuse_constant, parse_float=parse_float)
    except RecursionError:
        raise JsonTooDeep(max_depth or MAX_JSON_DEPTH) from None
    if max_depth is not None and json_depth(value) > max_depth:
        raise JsonTooDeep(max_depth)
    return value


def read_bounded(stream: Any) -> bytes:
    """Read a whole request stream, at most the body limit; raise the 413 if there is more."""
    if stream is None:
        return b""
    limit = max_body_bytes()
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise too_large()
    return bytes(data)


def _encoding(parser_context: Any) -> str:
    # DRF's own choice of charset, which refuses bytes-to-bytes codecs (bz2_codec); its stubs do not list it.
    return str(parsers.get_encoding(parser_context or {}))  # type: ignore[attr-defined]


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, bounded: the body limit, the nesting limit, and text PostgreSQL can store.

    `check_values = False` leaves the text check to the view (the batch endpoint, whose items fail alone)
    and the nesting limit to Python's recursion limit.
    """

    check_values = True

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        """Return the parsed body, or raise 413, 400 `malformed_json` or 400 `invalid` naming the field."""
        encoding = _encoding(parser_context)
        raw = read_bounded(stream)
        try:
            text = raw.decode(encoding)
            value, to_check = json_loads_checked(text, max_depth=MAX_JSON_DEPTH if self.check_values else None)
        except UnicodeDecodeError:
            raise ParseError(f"JSON parse error - the body is not valid {encoding}.") from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        if self.check_values:
            problems = value_problems(value) if to_check else {}
            if problems:
                raise ValidationError(problems)
        elif parser_context and parser_context.get("request") is not None:
            setattr(parser_context["request"], _VALUES_TO_CHECK, to_check)
        return value


class ItemsJSONParser(JSONParser):
    """The JSON parser of a batch: bounded in size, each item checked by the view (`item_problems`).

    It notes on the request whether the body's text can hold a value PostgreSQL cannot store at all
    (`values_to_check`): mostly not, and then no item's values need a walk.
    """

    check_values = False


def values_to_check(request: Any) -> bool:
    """Return False when the items parser found that the request's body cannot hold an unstorable value."""
    return bool(getattr(request, _VALUES_TO_CHECK, True))


def item_problems(item: Any, *, check_values: bool = True) -> ApiError | None:
    """Return the 400 of one batch item nested too deep or holding what PostgreSQL cannot store, or None.

    `check_values=False` skips the walk of its values (`values_to_check` said the body holds none of them).
    """
    ApiError = _api_error()
    if json_depth(item) > MAX_JSON_DEPTH:
        return ApiError(400, "malformed_json", str(JsonTooDeep()))
    problems = value_problems(item) if check_values else {}
    if problems:
        name, reasons = next(iter(problems.items()))
        return ApiError(400, "invalid", f"Invalid input: {name}: {reasons[0]}", problems)
    return None


class FormParser(parsers.FormParser):
    """DRF's form parser, reading at most the body limit."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        """Return the form as a QueryDict, or raise the 413."""
        encoding = _encoding(parser_context)
        return QueryDict(read_bounded(stream), encoding=encoding)


# --- Middleware (WSGI and ASGI) ----------------------------------------------------------------------------


def _content_length(value: str | bytes | None) -> int | None:
    if value in (None, "", b""):
        return None
    try:
        return int(value)
    except ValueError:
        return None


class BodyLimitMiddleware:
    """Refuse an oversized body (413) before anything reads it, and URLs holding control characters.

    First in the chain after the request context, so the CSRF check, sessions and every view see only
    bodies within the limit.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refused = self.refuse(request)
        return refused if refused is not None else self.get_response(request)

    @staticmethod
    def refuse(request: HttpRequest) -> HttpResponse | None:
        """Return the answer to a request refused for its URL or body size, or None to serve it."""
        if _CONTROL.search(request.path):
            return _answer(404, error_body("not_found", "Not found."))
        for name, values in request.GET.lists():
            if "\x00" in name or any("\x00" in value for value in values):
                field = _printable(name)
                body = error_body("invalid", f"Invalid input: {field}: {NUL_MESSAGE}", {field: [NUL_MESSAGE]})
                return _answer(400, body)
        limit = max_body_bytes()
        length = _content_length(request.META.get("CONTENT_LENGTH"))
        if length is not None:
            return _too_large_response() if length > limit else None
        chunked = "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
        wsgi_input = request.META.get("wsgi.input")
        if chunked and wsgi_input is not None:
            # No length: read what the server passes on (it de-chunks), one byte past the limit at most.
            data = wsgi_input.read(limit + 1)
            if len(data) > limit:
                return _too_large_response()
            request.META["CONTENT_LENGTH"] = str(len(data))
            request._stream = LimitedStream(io.BytesIO(data), len(data))  # type: ignore[assignment]  # what Django uses
        return None


def bounded_wsgi(app: WSGIApplication) -> WSGIApplication:
    """Wrap a WSGI app so a request whose charset Python cannot decode with is a 415 before Django builds it."""

    def bounded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        problem = charset_problem(environ.get("CONTENT_TYPE", ""))
        if problem is None:
            return app(environ, start_response)
        body = _unsupported_charset_body(problem)
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        start_response("415 Unsupported Media Type", headers)
        return [body]

    return bounded


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def bounded_asgi(app: AsgiApp) -> AsgiApp:
    """Wrap an ASGI app so an HTTP body over the limit is a 413 before the app (Django: its spool) sees it.

    A request whose charset Python cannot decode with is a 415 there too.
    """

    async def _refuse(send: Send, status: int, body: bytes) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": [*headers, (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def _send_413(send: Send) -> None:
        await _refuse(send, 413, json.dumps(error_body(too_large().error_code, too_large().message)).encode())

    async def bounded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        limit = max_body_bytes()
        headers = dict(scope.get("headers") or [])
        problem = charset_problem(headers.get(b"content-type", b"").decode("latin-1"))
        if problem is not None:
            await _refuse(send, 415, _unsupported_charset_body(problem))
            return
        length = _content_length(headers.get(b"content-length"))
        if length is not None:
            if length > limit:
                await _send_413(send)
                return
            await app(scope, receive, send)
            return
        # No length (chunked, or no body): take the body up to the limit, then hand it on as one message.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _send_413(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        # Django and DRF read as much as Content-Length says (nothing without one): give the body its length.
        scope = {**scope, "headers": [*scope.get("headers", []), (b"content-length", str(len(body)).encode())]}
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return bounded
