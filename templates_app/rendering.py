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
import threading
import types
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import update_wrapper
from typing import Any, cast

from django.conf import settings
from jinja2 import StrictUndefined, TemplateError, TemplateSyntaxError, UndefinedError, meta, nodes
from jinja2.environment import Template
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter, SecurityError
from markupsafe import Markup

from templates_app import budget
from templates_app.models import TemplateVersion

# The parts each channel's content may have. A missing optional string part renders as "", missing push
# data as {}, so consumers can index every part without checking.
CHANNEL_PARTS: dict[str, tuple[str, ...]] = {
    "email": ("subject", "text", "html"),
    "push": ("title", "body", "data"),
    "sms": ("text",),
    "inapp": ("title", "body"),
    "webhook": ("body",),
}
# Parts that are not a single template string: push data is a flat dict of strings, a webhook body any JSON.
STRUCTURED_PARTS: frozenset[tuple[str, str]] = frozenset({("push", "data"), ("webhook", "body")})
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
# as this stand-in, which the send path replaces with the recipient's signed link (preferences.emails). An
# example URL on a reserved domain, so a preview reads sensibly and HTML escaping leaves it intact.
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


def header_value(value: str) -> str:
    """Return `value` fit for one header line: line breaks and control characters folded to single spaces."""
    return _HEADER_BREAKS.sub(" ", value).strip() if value else value


def _make_env(*, autoescape: bool) -> _Sandbox:
    """Build a sandboxed environment with no loader, strict undefined and only harmless globals."""
    env = _Sandbox(
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
    env.globals["preferences_url"] = PREFERENCES_URL_PLACEHOLDER
    return env


_TEXT_ENV = _make_env(autoescape=False)
_HTML_ENV = _make_env(autoescape=True)
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
    env = _HTML_ENV if html else _TEXT_ENV
    where = f"{path}: " if path else ""
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
    """Pick the locale whose content serves `channel` and return it with the channel's compiled parts."""
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


def render(version: TemplateVersion, *, channel: str, locale: str, payload: dict) -> RenderedParts:
    """Render the parts of `channel` of a template version in the best locale for `locale`.

    Locale fallback: "pt-BR" → "pt" → the template's default locale (case-insensitive, `_` or `-`); a
    channel missing in the chosen locale falls back to the default locale's content for that channel.
    Raises RenderError for a missing variable (named), a syntax error, a sandbox violation or a channel the
    version does not have.
    """
    if version.pk is None:
        locale_used, compiled = _resolve_channel(version, channel, locale)
    else:
        locale_used, compiled = _CHANNEL_CACHE.get_or_create(
            (version.pk, locale, channel), lambda: _resolve_channel(version, channel, locale)
        )
    # Payload variables shadow the few globals, as in Jinja itself; both envs share the same globals.
    context_vars = {**_GLOBALS, **payload} if payload else dict(_GLOBALS)
    parts: dict[str, Any] = {}
    token = budget.start()  # one budget (time, loop iterations, characters) for the channel's parts
    try:
        for part, node in compiled:
            parts[part] = _render_node(node, context_vars, f"{channel}.{part}")
            if (channel, part) in HEADER_PARTS and isinstance(parts[part], str):
                parts[part] = header_value(parts[part])
    finally:
        budget.finish(token)
    for part in CHANNEL_PARTS[channel]:
        if part not in parts:
            parts[part] = {} if (channel, part) == ("push", "data") else ""
    if channel == "push":
        parts["data"] = {str(key): str(value) for key, value in parts["data"].items()}
    return RenderedParts(parts=parts, locale=locale_used)


def render_all(version: TemplateVersion, *, locale: str, payload: dict) -> dict[str, RenderedParts]:
    """Render every channel the version serves (those of the default locale); used by the previews."""
    return {channel: render(version, channel=channel, locale=locale, payload=payload) for channel in version.channels}


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
