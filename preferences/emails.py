"""Per-recipient links in rendered content: `{{ preferences_url }}` and the footer of optional email.

A rendering marks where its template placed `{{ preferences_url }}` with a marker of its own
(templates_app.rendering, `RenderedParts.link_marker`: the stand-in URL and a nonce drawn for that rendering).
Only that marker is replaced, so text that came from the payload, even if it imitates the stand-in, is never
turned into a recipient's signed link.
"""

from __future__ import annotations

from html import escape
from typing import Any

from preferences.translations import language_for, strings


def uses_preferences_url(parts: dict[str, Any], marker: str) -> bool:
    """Return whether rendered parts contain their rendering's `{{ preferences_url }}` marker."""
    return bool(marker) and any(marker in value for value in _strings(parts))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def _replace(value: Any, marker: str, url: str) -> Any:
    if isinstance(value, str):
        return value.replace(marker, url)
    if isinstance(value, dict):
        return {key: _replace(item, marker, url) for key, item in value.items()}
    if isinstance(value, list):
        return [_replace(item, marker, url) for item in value]
    return value


def personalize(
    parts: dict[str, Any],
    *,
    preferences_url: str,
    unsubscribe_url: str | None = None,
    locale: str | None = None,
    footer: bool = False,
    marker: str = "",
) -> dict[str, Any]:
    """Return a copy of rendered parts with the recipient's preference link in place of the rendering's marker.

    With `footer` (email of an optional category whose template does not place the link itself), the text and
    HTML bodies end with the preference link beside the unsubscribe link, in the recipient's language.
    `marker` is the rendering's `RenderedParts.link_marker`; empty says the parts hold none (the caller checked
    once per render): only the footer.
    """
    parts = _replace(parts, marker, preferences_url) if marker else dict(parts)
    if not footer:
        return parts
    t = strings(language_for(locale))
    lines = [f"{t['footer_manage']}: {preferences_url}"]
    if unsubscribe_url:
        lines.append(f"{t['footer_unsubscribe']}: {unsubscribe_url}")
    if parts.get("text"):
        parts["text"] = parts["text"].rstrip("\n") + "\n\n-- \n" + "\n".join(lines) + "\n"
    if parts.get("html"):
        links = [f'<a href="{escape(preferences_url)}">{escape(t["footer_manage"])}</a>']
        if unsubscribe_url:
            links.append(f'<a href="{escape(unsubscribe_url)}">{escape(t["footer_unsubscribe"])}</a>')
        block = f'<p style="font-size:12px;color:#555">{" · ".join(links)}</p>'
        html = parts["html"]
        at = html.lower().rfind("</body>")
        parts["html"] = html[:at] + block + html[at:] if at >= 0 else html + block
    return parts
