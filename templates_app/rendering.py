"""Render template versions in a Jinja2 sandbox, with locale fallback and a per-process compile cache.

Rendering sits on the hot path of a fan-out to millions of recipients, so each template string is compiled
once per process and reused: compiled parts are cached by (version id, locale, channel, part) and the
resolution of a requested locale to a channel's compiled parts by (version id, requested locale, channel).
A version is immutable, so a cached entry never goes stale; a newly published version has a new id and is
compiled on first use, without restarting workers. Both caches are bounded LRUs.

Templates are written by support staff but rendered with payloads from calling services, so they run in
Jinja2's immutable sandbox with `StrictUndefined`: no access to Python internals, no loader (nothing is read
from disk; include/import/extends are rejected at compile time), autoescaping only for the email HTML part.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
import types
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import update_wrapper
from typing import Any, cast

from django.conf import settings
from jinja2 import StrictUndefined, TemplateError, TemplateSyntaxError, UndefinedError, meta, nodes
from jinja2.environment import Template
from jinja2.runtime import LoopContext
from jinja2.sandbox import (
    ImmutableSandboxedEnvironment,
    SandboxedEscapeFormatter,
    SandboxedFormatter,
    SecurityError,
    safe_range,
)
from markupsafe import Markup

from core.chat import CHAT_PART, content_key
from templates_app import bounded, budget
from templates_app.models import TemplateVersion

# The parts each channel's content may have. A missing optional string part renders as "", missing push
# data as {}, so consumers can index every part without checking.
CHANNEL_PARTS: dict[str, tuple[str, ...]] = {
    "email": ("subject", "text", "html"),
    "push": ("title", "body", "data"),
    "sms": ("text",),
    "inapp": ("title", "body", "url"),
    "webhook": ("body",),
    # One part serves every chat network (core/chat.py): its text, Slack Block Kit `blocks`, a Teams Adaptive
    # Card `card`, a Discord `embed`, and for WhatsApp an approved Twilio `content_sid` with its `variables`.
    CHAT_PART: ("text", "blocks", "card", "embed", "content_sid", "variables"),
}
# Parts that are not a single template string: push data is a flat dict of strings, a webhook body any JSON, and
# the chat part's blocks, card, embed and variables JSON whose strings are templates.
STRUCTURED_PARTS: frozenset[tuple[str, str]] = frozenset(
    {
        ("push", "data"),
        ("webhook", "body"),
        (CHAT_PART, "blocks"),
        (CHAT_PART, "card"),
        (CHAT_PART, "embed"),
        (CHAT_PART, "variables"),
    }
)
# What a missing structured part renders as (push data and the chat part's objects {}, Slack blocks []).
_EMPTY_STRUCTURED: dict[tuple[str, str], Any] = {
    ("push", "data"): {},
    (CHAT_PART, "blocks"): [],
    (CHAT_PART, "card"): {},
    (CHAT_PART, "embed"): {},
    (CHAT_PART, "variables"): {},
}
# Only this part is HTML, so only it is autoescaped; everything else is plain text or JSON.
HTML_PARTS: frozenset[tuple[str, str]] = frozenset({("email", "html")})

# Parts that become a header line (an email's Subject): CR/LF there would end the header (Django refuses it
# with BadHeaderError, other transports would let a payload inject headers), so they are folded to spaces.
HEADER_PARTS: frozenset[tuple[str, str]] = frozenset({("email", "subject")})
_HEADER_BREAKS = re.compile(r"[\r\n\x00-\x08\x0b-\x1f\x7f\u2028\u2029]+")

# Bounds against templates that would exhaust memory or CPU: string/list repetition and exponentiation.
MAX_REPEAT_LENGTH = 100_000
MAX_EXPONENT = 1_000

_MARKERS = ("{{", "{%", "{#")
# `{{ preferences_url }}` is per recipient, but rendered parts are cached per notification and locale; it renders
# as a stand-in, which the send path replaces with the recipient's signed link (preferences.emails). An
# example URL on a reserved domain, so a preview reads sensibly and HTML escaping leaves it intact, ending in a
# nonce drawn for each rendering (RenderedParts.link_marker): the send path replaces only that rendering's
# marker, so a payload value that imitates the stand-in (whole, or pieced together from several variables)
# never becomes a recipient's signed link. Only text the template author wrote can place the link.
PREFERENCES_URL_PLACEHOLDER = "https://preferences.invalid/notifier-preferences-url"
_UNDEFINED_NAME = re.compile(r"^'([^']+)' is undefined$")
_MISSING_ATTRIBUTE = re.compile(r"has no attribute '([^']+)'$")


class RenderError(Exception):
    """A template could not be compiled or rendered; the message says where and why, never leaks internals.

    `code` is "template_budget" when a budget (templates_app.budget) was broken, else "render_error".
    """

    def __init__(
        self, message: str, *, variable: str | None = None, path: str = "", code: str = "render_error"
    ) -> None:
        super().__init__(message)
        self.message = message
        self.variable = variable
        self.path = path
        self.code = code


@dataclass(frozen=True, slots=True)
class RenderedParts:
    """The rendered parts of one channel and the locale whose content was used."""

    parts: dict[str, Any]
    locale: str
    # This rendering's `{{ preferences_url }}` stand-in (PREFERENCES_URL_PLACEHOLDER + "/" + a fresh nonce).
    link_marker: str = ""


class _BoundedFormatter(SandboxedFormatter):
    """The sandbox's str.format, refusing widths and precisions above the budget's maximum."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        budget.check_format_spec(format_spec)
        return super().format_field(value, format_spec)


class _BoundedEscapeFormatter(_BoundedFormatter, SandboxedEscapeFormatter):
    """The same for Markup strings (email HTML)."""


class _Sandbox(ImmutableSandboxedEnvironment):
    """Jinja2's immutable sandbox, also bounding repetition, exponentiation, concatenation, formatting widths
    and the str methods that pad or multiply (see templates_app.budget)."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        """Call from sandboxed code: refuse amplifying str methods, and any result longer than a part."""
        budget.check_str_method(__obj, args, kwargs)
        return budget.check_result(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """Sandbox str.format / format_map like Jinja does, with widths bounded."""
        if not isinstance(value, types.MethodType | types.BuiltinMethodType) or value.__name__ not in (
            "format",
            "format_map",
        ):
            return None
        owner = value.__self__
        if not isinstance(owner, str):
            return None
        formatter = (
            _BoundedEscapeFormatter(self, escape=owner.escape) if isinstance(owner, Markup) else _BoundedFormatter(self)
        )
        is_map = value.__name__ == "format_map"

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                kwargs, args = args[0], ()
            return budget.check_result(type(owner)(formatter.vformat(owner, args, kwargs)))

        return update_wrapper(wrapper, value)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """Refuse `*`, `**`, `+` and `%` whose result would be huge; otherwise apply the operator."""
        budget.check_binop(operator, left, right)
        if operator == "**":
            if isinstance(right, int | float) and abs(right) > MAX_EXPONENT:
                raise SecurityError(f"exponent larger than {MAX_EXPONENT}")
        elif operator == "*":
            for seq, count in ((left, right), (right, left)):
                sized = isinstance(seq, str | list | tuple) and isinstance(count, int)
                if sized and len(seq) * count > MAX_REPEAT_LENGTH:
                    raise SecurityError(f"repetition longer than {MAX_REPEAT_LENGTH}")
        return budget.check_result(super().call_binop(context, operator, left, right))


class _NeedsIsolation(Exception):
    """A bounded template met a value outside the bounded subset at run time (say `+` on two lists)."""


# Numbers the bounded environment multiplies or formats in-process: products of these stay small.
_SMALL_INT_BITS = 64


def _small_number(value: Any) -> bool:
    if isinstance(value, bool | float):
        return True
    return isinstance(value, int) and value.bit_length() <= _SMALL_INT_BITS


class _BoundedSandbox(_Sandbox):
    """The environment of templates proven bounded (templates_app.bounded), rendered in-process.

    What the syntax allows is bounded only for the values it assumes; where a value breaks that assumption
    (an operator on lists, a method of an unexpected object), the rendering stops and runs in a child instead.
    """

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        """Call only the linear methods of payload values, `loop.cycle` and `range` (as a loop's iterable)."""
        owner = getattr(__obj, "__self__", None)
        if __obj is not safe_range and not isinstance(owner, str | dict | LoopContext):
            raise _NeedsIsolation("a call outside the bounded subset")
        budget.current().tick()
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """Apply `*`, `%` and `+` to small numbers (and `+` to two strings); anything else runs in a child."""
        numbers = _small_number(left) and _small_number(right)
        strings = operator == "+" and isinstance(left, str) and isinstance(right, str)
        if not (numbers or strings or (operator == "+" and _number(left) and _number(right))):
            raise _NeedsIsolation(f"'{operator}' outside the bounded subset")
        return super().call_binop(context, operator, left, right)


def _number(value: Any) -> bool:
    return isinstance(value, int | float)


def header_value(value: str) -> str:
    """Return `value` fit for one header line: line breaks and control characters folded to single spaces."""
    return _HEADER_BREAKS.sub(" ", value).strip() if value else value


def _make_env(*, autoescape: bool, bounded_subset: bool = False) -> _Sandbox:
    """Build a sandboxed environment with no loader, strict undefined and only harmless globals."""
    env = (_BoundedSandbox if bounded_subset else _Sandbox)(
        loader=None,
        undefined=StrictUndefined,
        autoescape=autoescape,
        # Prints None as "" (an absent optional value should not read "None") and counts what is printed.
        finalize=budget.finalize,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
        cache_size=0,
    )
    # lipsum only burns CPU; nothing else is added so the template surface stays small.
    env.globals.pop("lipsum", None)
    env.filters = budget.guarded_filters()
    if bounded_subset:
        env.filters = budget.ticked_filters(env.filters, bounded.BOUNDED_FILTERS)
    env.globals["preferences_url"] = PREFERENCES_URL_PLACEHOLDER
    return env


_TEXT_ENV = _make_env(autoescape=False)
_HTML_ENV = _make_env(autoescape=True)
_BOUNDED_TEXT_ENV = _make_env(autoescape=False, bounded_subset=True)
_BOUNDED_HTML_ENV = _make_env(autoescape=True, bounded_subset=True)
# True in a render child (templates_app.render_worker): there every template renders here, under its limits.
ISOLATED = False
_GLOBALS: dict[str, Any] = dict(_TEXT_ENV.globals)


class _LRU:
    """A small thread-safe LRU mapping (workers may render from a thread pool)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get_or_create(self, key: Any, create: Callable[[], Any]) -> Any:
        """Return the cached value for `key`, creating (outside the lock) and storing it on a miss."""
        with self._lock:
            try:
                value = self._data[key]
            except KeyError:
                self.misses += 1
            else:
                self._data.move_to_end(key)
                self.hits += 1
                return value
        # Compiling outside the lock: two threads may compile the same part once each, which is harmless.
        value = create()
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
        return value

    def clear(self) -> None:
        """Drop every entry and reset the counters."""
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)


_PART_CACHE = _LRU(getattr(settings, "TEMPLATE_CACHE_PARTS", 8192))
_CHANNEL_CACHE = _LRU(getattr(settings, "TEMPLATE_CACHE_CHANNELS", 8192))


def cache_clear() -> None:
    """Empty the compile caches (tests and benchmarks; versions are immutable, so production never needs it)."""
    _PART_CACHE.clear()
    _CHANNEL_CACHE.clear()


def cache_info() -> dict[str, int]:
    """Return the sizes and hit/miss counters of the compile caches."""
    return {
        "parts": len(_PART_CACHE),
        "part_hits": _PART_CACHE.hits,
        "part_misses": _PART_CACHE.misses,
        "channels": len(_CHANNEL_CACHE),
        "channel_hits": _CHANNEL_CACHE.hits,
        "channel_misses": _CHANNEL_CACHE.misses,
    }


# --- locales -----------------------------------------------------------------------------------------


def normalize_locale(locale: str) -> str:
    """Return the lookup form of a locale: lower case, `-` as separator ("pt_BR" → "pt-br")."""
    return locale.strip().replace("_", "-").lower()


def locale_candidates(locale: str | None, default_locale: str) -> list[str]:
    """Return the normalized locales to try in order: "pt-BR" → ["pt-br", "pt", <default>]."""
    candidates: list[str] = []
    if locale:
        subtags = normalize_locale(locale).split("-")
        for n in range(len(subtags), 0, -1):
            candidate = "-".join(subtags[:n])
            if candidate and candidate not in candidates:
                candidates.append(candidate)
    default = normalize_locale(default_locale)
    if default not in candidates:
        candidates.append(default)
    return candidates


def _locale_index(content: Mapping[str, Any]) -> dict[str, str]:
    """Map each content locale's lookup form to its key as stored."""
    return {normalize_locale(key): key for key in content}


# --- compiling ---------------------------------------------------------------------------------------

_FORBIDDEN_NODES: tuple[type[nodes.Node], ...] = (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)


def compile_string(source: str, *, html: bool = False, path: str = "") -> Template | str:
    """Compile one template string, or return it as is when it has no Jinja syntax at all.

    Raises RenderError for a syntax error, for include/import/extends (templates never read other
    templates), and for access to underscored attributes, which the sandbox would refuse at render time.
    """
    if not any(marker in source for marker in _MARKERS):
        return source
    try:
        return _compile(source, html=html, path=path)
    except RecursionError:
        # Parsing, checking and code generation recurse along the template's nesting ("((((...))))").
        where = f"{path}: " if path else ""
        message = f"{where}over the template budget: expressions or blocks nested too deeply"
        raise RenderError(message, path=path, code="template_budget") from None


def _compile(source: str, *, html: bool, path: str) -> Template:
    env = _HTML_ENV if html else _TEXT_ENV
    where = f"{path}: " if path else ""
    # Every `{{ }}` holds at least one node and every pair of `{% %}` tags (a block and its end) at least one:
    # refused before parsing, which for 100 kB of tags costs the saving thread a good part of a second.
    tags = source.count("{{") + source.count("{%")
    if tags > 2 * settings.TEMPLATE_MAX_NODES:
        limit = settings.TEMPLATE_MAX_NODES
        message = f"{where}over the template budget: {tags} tags, more than {limit} expressions and blocks allowed"
        raise RenderError(message, path=path, code="template_budget")
    try:
        tree = env.parse(source)
    except TemplateSyntaxError as exc:
        raise RenderError(f"{where}syntax error on line {exc.lineno}: {exc.message}", path=path) from None
    for node in tree.find_all(_FORBIDDEN_NODES):
        tag = type(node).__name__.lower().replace("fromimport", "from-import")
        raise RenderError(f"{where}'{tag}' is not allowed: a template cannot read other templates", path=path)
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        name = node.attr if isinstance(node, nodes.Getattr) else getattr(cast(nodes.Getitem, node).arg, "value", None)
        if isinstance(name, str) and name.startswith("_"):
            raise RenderError(f"{where}access to '{name}' is not allowed", path=path)
    problems = budget.static_problems(tree)
    if problems:
        raise RenderError(f"{where}over the template budget: {problems[0]}", path=path, code="template_budget")
    bounded.mark_loop_ranges(tree)
    if not ISOLATED and bounded.unbounded_reason(tree) is None:
        env = _BOUNDED_HTML_ENV if html else _BOUNDED_TEXT_ENV
    budget.instrument(tree)
    try:
        return env.from_string(tree)
    except TemplateError as exc:
        raise RenderError(f"{where}{exc.message or type(exc).__name__}", path=path) from None


def _compile_node(value: Any, *, html: bool, path: str) -> Any:
    """Compile every string in a JSON value (structured parts), keeping its shape."""
    if isinstance(value, str):
        return compile_string(value, html=html, path=path)
    if isinstance(value, dict):
        return {key: _compile_node(item, html=html, path=f"{path}.{key}") for key, item in value.items()}
    if isinstance(value, list):
        return [_compile_node(item, html=html, path=f"{path}[{i}]") for i, item in enumerate(value)]
    return value


def _describe(exc: Exception, path: str) -> RenderError:
    """Turn a rendering exception into a RenderError that names the missing variable, without internals."""
    if isinstance(exc, budget.TemplateBudgetError):
        return RenderError(f"{path}: over the template budget: {exc}", path=path, code="template_budget")
    if isinstance(exc, RecursionError):
        return RenderError(f"{path}: over the template budget: recursion too deep", path=path, code="template_budget")
    if isinstance(exc, MemoryError):
        return RenderError(f"{path}: over the template budget: memory", path=path, code="template_budget")
    if isinstance(exc, SecurityError):
        return RenderError(f"{path}: unsafe operation refused by the sandbox: {exc}", path=path)
    if isinstance(exc, UndefinedError):
        message = str(exc.message or exc)
        match = _UNDEFINED_NAME.match(message) or _MISSING_ATTRIBUTE.search(message)
        variable = match.group(1) if match else None
        if variable is not None and variable.startswith("_"):
            return RenderError(f"{path}: unsafe operation refused by the sandbox", path=path)
        text = f"missing variable '{variable}'" if variable else message
        return RenderError(f"{path}: {text}", variable=variable, path=path)
    if isinstance(exc, TemplateError):
        return RenderError(f"{path}: {exc.message or type(exc).__name__}", path=path)
    return RenderError(f"{path}: {type(exc).__name__}: {exc}", path=path)


def _render_node(node: Any, payload: Mapping[str, Any], path: str) -> Any:
    """Render a compiled string or structure with `payload`."""
    if isinstance(node, Template):
        try:
            # Template.render() would copy the globals and payload into a new dict and walk the globals
            # for every part; render() merges them once per call and shares that dict (measured ~4x faster).
            # Context only reads its parent (`[]`, `in`, `get`): any Mapping does; copying it is what this avoids.
            context = node.environment.context_class(node.environment, payload, None, node.blocks)  # type: ignore[arg-type]
            return budget.joined_output(node.root_render_func(context), path)
        except _NeedsIsolation:
            raise
        except Exception as exc:
            raise _describe(exc, path) from None
    if isinstance(node, dict):
        return {key: _render_node(item, payload, f"{path}.{key}") for key, item in node.items()}
    if isinstance(node, list):
        return [_render_node(item, payload, f"{path}[{i}]") for i, item in enumerate(node)]
    return node


def compile_part(channel: str, part: str, value: Any, *, path: str = "") -> Any:
    """Compile one part of a channel (a string, or for push data / webhook body a JSON structure)."""
    path = path or f"{channel}.{part}"
    html = (channel, part) in HTML_PARTS
    if (channel, part) in STRUCTURED_PARTS:
        return _compile_node(value, html=html, path=path)
    if not isinstance(value, str):
        raise RenderError(f"{path}: must be a string", path=path)
    return compile_string(value, html=html, path=path)


def _compiled_part(version: TemplateVersion, locale_key: str, channel: str, part: str) -> Any:
    """Return the compiled part, from the cache when the version is saved (and therefore immutable)."""
    value = version.content[locale_key][channel][part]
    if version.pk is None:
        return compile_part(channel, part, value)
    return _PART_CACHE.get_or_create(
        (version.pk, locale_key, channel, part), lambda: compile_part(channel, part, value)
    )


CompiledChannel = tuple[str, tuple[tuple[str, Any], ...]]


def _resolve_channel(version: TemplateVersion, channel: str, locale: str | None) -> CompiledChannel:
    """Pick the locale whose content serves `channel` and return it with the channel's compiled parts.

    A chat network is served by the content's `chat` part (core.chat.content_key).
    """
    channel = content_key(channel)
    parts_known = CHANNEL_PARTS.get(channel)
    if parts_known is None:
        raise RenderError(f"unknown channel '{channel}'")
    content = version.content or {}
    index = _locale_index(content)
    default_locale = version.template.default_locale
    default_key = index.get(normalize_locale(default_locale))
    if default_key is None and content:
        # A pinned old version may predate a change of the template's default locale.
        default_key = sorted(content)[0]
    chosen = None
    for candidate in locale_candidates(locale, default_locale):
        key = index.get(candidate)
        if key is not None and isinstance(content[key], dict) and channel in content[key]:
            chosen = key
            break
    if chosen is None and default_key is not None and channel in (content.get(default_key) or {}):
        chosen = default_key
    if chosen is None:
        raise RenderError(f"template version {version} has no '{channel}' content")
    channel_content = content[chosen][channel]
    compiled = tuple(
        (part, _compiled_part(version, chosen, channel, part)) for part in parts_known if part in channel_content
    )
    return chosen, compiled


def _resolved(version: TemplateVersion, channel: str, locale: str) -> CompiledChannel:
    if version.pk is None:
        return _resolve_channel(version, channel, locale)
    return cast(
        CompiledChannel,
        _CHANNEL_CACHE.get_or_create((version.pk, locale, channel), lambda: _resolve_channel(version, channel, locale)),
    )


def _is_bounded(node: Any) -> bool:
    """Return whether a compiled part renders in the bounded environment (plain strings trivially do)."""
    if isinstance(node, Template):
        return node.environment is _BOUNDED_TEXT_ENV or node.environment is _BOUNDED_HTML_ENV
    if isinstance(node, dict):
        return all(_is_bounded(item) for item in node.values())
    if isinstance(node, list):
        return all(_is_bounded(item) for item in node)
    return True


def _payload_within(payload: Any, limit: int) -> bool:
    """Return whether a JSON payload's strings and keys add up to at most `limit` characters (8 per scalar).

    A bounded template renders in-process only with such a payload: the subset bounds what a template makes by
    a constant factor of its inputs (templates_app.bounded), this bounds the inputs.
    """
    stack, total = [payload], 0
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, dict):
            total += 8 * len(value) + sum(len(key) for key in value if isinstance(key, str))
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            total += 8 * len(value)
            stack.extend(value)
        else:
            total += 8
        if total > limit:
            return False
    return True


def render(version: TemplateVersion, *, channel: str, locale: str, payload: dict) -> RenderedParts:
    """Render the parts of `channel` of a template version in the best locale for `locale`, within its budgets.

    Locale fallback: "pt-BR" → "pt" → the template's default locale (case-insensitive, `_` or `-`); a
    channel missing in the chosen locale falls back to the default locale's content for that channel.
    Raises RenderError for a missing variable (named), a syntax error, a sandbox violation, a broken budget
    (code "template_budget") or a channel the version does not have.

    A template in the bounded subset (templates_app.bounded) with a modest payload renders in this thread;
    any other renders in a child process with hard memory and time limits (templates_app.isolation).
    """
    locale_used, compiled = _resolved(version, channel, locale)
    spent = 0.0
    if _in_process(compiled, payload):
        started = time.monotonic()
        try:
            return _render_compiled(channel, locale_used, compiled, payload)
        except _NeedsIsolation:
            spent = time.monotonic() - started
    return _render_isolated([(version, channel, locale, payload)], spent=[spent])[0].unwrap()


def _in_process(compiled: tuple[tuple[str, Any], ...], payload: dict) -> bool:
    """Return whether this rendering may run in this thread (the bounded subset, a modest payload)."""
    if ISOLATED:
        return True
    return all(_is_bounded(node) for _, node in compiled) and _payload_within(
        payload, settings.TEMPLATE_INPROCESS_PAYLOAD_CHARS
    )


@dataclass(frozen=True, slots=True)
class RenderOutcome:
    """What `render_many` gives per request: the rendered parts, or the error that request alone met."""

    rendered: RenderedParts | None = None
    error: RenderError | None = None

    def unwrap(self) -> RenderedParts:
        """Return the rendered parts or raise the error."""
        if self.error is not None:
            raise self.error
        assert self.rendered is not None
        return self.rendered


RenderRequest = tuple[TemplateVersion, str, str, dict]


def render_many(requests: list[RenderRequest]) -> list[RenderOutcome]:
    """Render (version, channel, locale, payload) requests; those that need a child share one round trip.

    Each request gets its own budget and its own outcome: one that breaks a budget fails alone.
    """
    outcomes: list[RenderOutcome | None] = [None] * len(requests)
    isolated: list[int] = []
    spent: list[float] = []
    for i, (version, channel, locale, payload) in enumerate(requests):
        started = time.monotonic()
        try:
            locale_used, compiled = _resolved(version, channel, locale)
            if _in_process(compiled, payload):
                outcomes[i] = RenderOutcome(rendered=_render_compiled(channel, locale_used, compiled, payload))
                continue
        except _NeedsIsolation:
            pass
        except RenderError as exc:
            outcomes[i] = RenderOutcome(error=exc)
            continue
        isolated.append(i)
        spent.append(time.monotonic() - started)
    if isolated:
        results = _render_isolated([requests[i] for i in isolated], spent=spent)
        for i, outcome in zip(isolated, results, strict=True):
            outcomes[i] = outcome
    return [outcome for outcome in outcomes if outcome is not None]


def _render_isolated(requests: list[RenderRequest], *, spent: list[float]) -> list[RenderOutcome]:
    """Render requests in a render child, one round trip for all of them.

    `spent` is the time each request already spent in an in-process attempt, taken off its time budget: a
    rendering that moves to a child mid-way gets the rest of its budget, not a second one.
    """
    from templates_app import isolation  # the pool is started on first use, never at import

    seconds = float(settings.TEMPLATE_MAX_RENDER_SECONDS)
    items = [
        _isolated_item(*request, seconds=max(seconds - used, 0.0) if used else None)
        for request, used in zip(requests, spent, strict=True)
    ]
    answers = isolation.POOL.render(items)
    return [_outcome_from_answer(answer) for answer in answers]


def _isolated_item(version: TemplateVersion, channel: str, locale: str, payload: dict, *, seconds: float | None) -> Any:
    from templates_app.isolation import IsolatedItem

    return IsolatedItem(
        version_pk=version.pk,
        default_locale=version.template.default_locale,
        content=version.content,
        channel=channel,
        locale=locale,
        payload=payload,
        seconds=seconds,
    )


def _outcome_from_answer(answer: dict[str, Any]) -> RenderOutcome:
    if "ok" in answer:
        ok = answer["ok"]
        return RenderOutcome(
            rendered=RenderedParts(parts=ok["parts"], locale=ok["locale"], link_marker=ok.get("link_marker", ""))
        )
    error = answer["error"]
    message = str(error.get("message") or "rendering failed")
    if error.get("code") == "template_budget" and "template budget" not in message:
        message = f"over the template budget: {message}"
    code, path = error.get("code") or "render_error", error.get("path") or ""
    return RenderOutcome(error=RenderError(message, variable=error.get("variable"), path=path, code=code))


def render_here(version: TemplateVersion, *, channel: str, locale: str, payload: dict) -> RenderedParts:
    """Render in this thread whatever the template (the render child's entry point; budgets still apply)."""
    locale_used, compiled = _resolved(version, channel, locale)
    return _render_compiled(channel, locale_used, compiled, payload)


def _render_compiled(
    channel: str, locale_used: str, compiled: tuple[tuple[str, Any], ...], payload: dict
) -> RenderedParts:
    # Payload variables shadow the few globals, as in Jinja itself (both envs share the same globals), except
    # preferences_url: a payload cannot choose what the template's preference link points to.
    link_marker = f"{PREFERENCES_URL_PLACEHOLDER}/{secrets.token_hex(16)}"
    context_vars = {**_GLOBALS, **payload} if payload else dict(_GLOBALS)
    context_vars["preferences_url"] = link_marker
    parts: dict[str, Any] = {}
    token = budget.start()  # one budget (time, loop iterations, characters) for the channel's parts
    try:
        for part, node in compiled:
            parts[part] = _render_node(node, context_vars, f"{channel}.{part}")
            if (channel, part) in HEADER_PARTS and isinstance(parts[part], str):
                parts[part] = header_value(parts[part])
    finally:
        budget.finish(token)
    for part in CHANNEL_PARTS[content_key(channel)]:
        if part not in parts:
            parts[part] = _EMPTY_STRUCTURED.get((content_key(channel), part), "")
    if channel == "push":
        parts["data"] = {str(key): str(value) for key, value in parts["data"].items()}
    return RenderedParts(parts=parts, locale=locale_used, link_marker=link_marker)


def render_all(version: TemplateVersion, *, locale: str, payload: dict) -> dict[str, RenderedParts]:
    """Render every channel the version serves (those of the default locale); used by the previews.

    The channels that need a render child share one round trip; the first error met is raised.
    """
    channels = list(version.channels)
    outcomes = render_many([(version, channel, locale, payload) for channel in channels])
    return {channel: outcome.unwrap() for channel, outcome in zip(channels, outcomes, strict=True)}


def template_variables(content: Mapping[str, Any]) -> list[str]:
    """Return the top-level variables the content's templates use (to prefill a sample payload)."""
    found: set[str] = set()

    def visit(value: Any) -> None:
        if isinstance(value, str):
            if any(marker in value for marker in _MARKERS):
                try:
                    found.update(meta.find_undeclared_variables(_TEXT_ENV.parse(value)))
                except TemplateSyntaxError:
                    pass
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, list):
            for item in value:
                visit(item)

    visit(content)
    return sorted(found - set(_TEXT_ENV.globals))
