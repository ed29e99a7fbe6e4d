"""The template editor's form logic: content as one block of fields per (locale, channel), not one JSON area.

Field names carry where a value lives: `c__<locale>__<channel>__<part>` (locales never contain "__"). The
same parsing serves the form (saving, without JavaScript) and the preview view (the script posts the form).
Structured parts (push data, webhook body) are JSON text areas, parsed here so an error names its line.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from core.chat import CHAT_PART
from templates_app.layouts import render
from templates_app.rendering import (
    CHANNEL_PARTS,
    STRUCTURED_PARTS,
    RenderError,
    locale_candidates,
    normalize_locale,
    template_variables,
)
from templates_app.services import ONE_OF_PARTS, REQUIRED_PARTS
from templates_app.sms import sms_info

PREFIX = "c__"
REMOVE_PREFIX = "remove__"
SEP = "__"
# Rows of each part's text area: bodies are long, subjects and titles one line.
ONE_LINE_PARTS = frozenset({("email", "subject"), ("push", "title"), ("inapp", "title")})


def field_name(locale: str, channel: str, part: str) -> str:
    """Return the form field name of one part of one block."""
    return f"{PREFIX}{locale}{SEP}{channel}{SEP}{part}"


def remove_name(locale: str, channel: str) -> str:
    """Return the name of the checkbox that removes a block on save."""
    return f"{REMOVE_PREFIX}{locale}{SEP}{channel}"


def parse_field_name(name: str) -> tuple[str, str, str] | None:
    """Return (locale, channel, part) of a block field name, or None for any other name."""
    if not name.startswith(PREFIX):
        return None
    pieces = name[len(PREFIX) :].split(SEP)
    if len(pieces) != 3 or pieces[1] not in CHANNEL_PARTS or pieces[2] not in CHANNEL_PARTS[pieces[1]]:
        return None
    return pieces[0], pieces[1], pieces[2]


def content_path_to_field(path: str) -> str | None:
    """Map a validation path ("content.de.email.subject", "content.de.push.data.k") to its field name."""
    pieces = path.split(".")
    if len(pieces) < 4 or pieces[0] != "content":
        return None
    locale, channel, part = pieces[1], pieces[2], pieces[3].split("[")[0]
    if channel not in CHANNEL_PARTS or part not in CHANNEL_PARTS[channel]:
        return None
    return field_name(locale, channel, part)


def part_to_text(channel: str, part: str, value: Any) -> str:
    """Return a part as the text its field shows (structured parts as indented JSON)."""
    if (channel, part) in STRUCTURED_PARTS:
        return json.dumps(value, indent=2, ensure_ascii=False)
    return value if isinstance(value, str) else ""


def blocks_of(content: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Return the (locale, channel) blocks of a version's content, channels in their usual order."""
    return [
        (locale, channel)
        for locale, channels in content.items()
        if isinstance(channels, dict)
        for channel in CHANNEL_PARTS
        if channel in channels
    ]


@dataclass
class ParsedContent:
    """The content a posted form describes, and the errors found while reading it (by field name)."""

    content: dict[str, dict[str, dict[str, Any]]]
    errors: dict[str, list[str]] = field(default_factory=dict)


def content_from_data(data: Mapping[str, Any], blocks: list[tuple[str, str]]) -> ParsedContent:
    """Build {locale: {channel: {part: value}}} from posted block fields; blocks ticked for removal are left out.

    Empty parts are omitted (validation then says which are required); JSON parts must parse.
    """
    parsed = ParsedContent(content={})
    for locale, channel in blocks:
        if data.get(remove_name(locale, channel)):
            continue
        parts: dict[str, Any] = {}
        for part in CHANNEL_PARTS[channel]:
            name = field_name(locale, channel, part)
            raw = str(data.get(name) or "").replace("\r\n", "\n")
            if not raw.strip():
                continue
            if (channel, part) in STRUCTURED_PARTS:
                try:
                    parts[part] = json.loads(raw)
                except json.JSONDecodeError as exc:
                    parsed.errors[name] = [f"Not valid JSON on line {exc.lineno}, column {exc.colno}: {exc.msg}"]
                    continue
            else:
                parts[part] = raw
        if not parts and not any(field_name(locale, channel, p) in parsed.errors for p in CHANNEL_PARTS[channel]):
            # An empty block: say what it needs beside the fields that need it, not "non-empty object".
            for part in REQUIRED_PARTS.get(channel, ()):
                parsed.errors[field_name(locale, channel, part)] = ["is required"]
            one_of = ONE_OF_PARTS.get(channel)
            if one_of:
                parsed.errors[field_name(locale, channel, one_of[0])] = [f"needs at least one of: {', '.join(one_of)}"]
        parsed.content.setdefault(locale, {})[channel] = parts
    return parsed


def posted_blocks(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Return the blocks present in posted data, in the order their fields came."""
    found: list[tuple[str, str]] = []
    for name in data:
        parsed = parse_field_name(name)
        if parsed and (parsed[0], parsed[1]) not in found:
            found.append((parsed[0], parsed[1]))
    return found


def unknown_variable_errors(content: Mapping[str, Any], default_locale: str) -> dict[str, list[str]]:
    """Name variables a locale uses that its template's default locale does not (a typo, or a payload gap).

    Every locale renders with the same payload as the default locale, so a name only one translation uses
    would fail at send time for exactly the recipients of that translation.
    """
    index = {normalize_locale(key): key for key in content}
    default_key = index.get(normalize_locale(default_locale))
    if default_key is None:
        return {}
    known = set(template_variables({default_key: content[default_key]}))
    errors: dict[str, list[str]] = {}
    for locale, channels in content.items():
        if locale == default_key or not isinstance(channels, dict):
            continue
        for channel, parts in channels.items():
            if not isinstance(parts, dict):
                continue
            for part, value in parts.items():
                unknown = sorted(set(template_variables({"x": value})) - known)
                if unknown:
                    names = ", ".join(f"'{n}'" for n in unknown)
                    errors[field_name(locale, channel, part)] = [
                        f"Unknown variable {names}: the default locale '{default_key}' does not use it"
                        f" (known: {', '.join(sorted(known)) or 'none'})."
                    ]
    return errors


def chosen_locale(content: Mapping[str, Any], channel: str, locale: str, default_locale: str) -> str | None:
    """Return the content locale that serves `channel` for `locale` (the renderer's fallback rule)."""
    index = {normalize_locale(key): key for key in content}
    for candidate in locale_candidates(locale, default_locale):
        key = index.get(candidate)
        if key is not None and channel in (content.get(key) or {}):
            return key
    return None


def preview(
    *, version: Any, content: Mapping[str, Any], locale: str, payload: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """Render every channel of an unsaved version; return the channels shown and render errors by field name."""
    results: list[dict[str, Any]] = []
    errors: dict[str, list[str]] = {}
    default_locale = version.template.default_locale
    for channel in version.channels:
        used = chosen_locale(content, channel, locale, default_locale) or default_locale
        try:
            rendered = render(version, channel=channel, locale=locale, payload=payload)
        except RenderError as exc:
            part = exc.path.split(".")[1] if exc.path.count(".") >= 1 else ""
            name = field_name(used, channel, part.split("[")[0]) if part else ""
            errors.setdefault(name or "content", []).append(exc.message)
            continue
        parts = []
        for name, value in rendered.parts.items():
            text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
            item: dict[str, Any] = {"name": name, "text": text, "html": channel == "email" and name == "html"}
            if channel == "sms":
                info = sms_info(text)
                item["sms"] = {"encoding": info.encoding, "units": info.units, "segments": info.segments}
            parts.append(item)
        results.append({"channel": channel, "locale": rendered.locale, "parts": parts})
    return results, errors


def _flatten(content: Mapping[str, Any]) -> list[str]:
    """Return a version's content as lines: a header per (locale, channel, part), then its text."""
    lines: list[str] = []
    for locale in sorted(content):
        channels = content[locale] or {}
        for channel in CHANNEL_PARTS:
            for part in CHANNEL_PARTS[channel]:
                if part in channels.get(channel, {}):
                    lines.append(f"── {locale} · {channel} · {part}")
                    lines.extend(part_to_text(channel, part, channels[channel][part]).splitlines() or [""])
    return lines


def version_diff_table(old: Mapping[str, Any], new: Mapping[str, Any], *, old_label: str, new_label: str) -> str:
    """Return an HTML table of the differences between two versions' content (difflib escapes the text)."""
    return difflib.HtmlDiff(wrapcolumn=70).make_table(
        _flatten(old), _flatten(new), fromdesc=old_label, todesc=new_label, context=True, numlines=2
    )


def known_channels() -> list[str]:
    """Return the channels a block can be added for (configured and with known parts; `chat` for every network)."""
    return [c for c in settings.CHANNELS if c in CHANNEL_PARTS] + [CHAT_PART]
