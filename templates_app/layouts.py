"""Email layouts: place a template's rendered HTML in a layout, inline its CSS, derive a text part.

A layout is a versioned pair of template strings (HTML and optionally text) that each use `{{ content }}`.
The email channel of a template version uses the layout it names (`TemplateVersion.layout`), else the
default layout of its category (`"layout"` in NOTIFIER_CATEGORIES), else its project's default layout
(`projects_project.default_layout`), always in the layout's newest version of the template's environment.

Composition, in order (tracking and the per-recipient footer run later, on the result):

1. the template's email parts are rendered as usual (templates_app.rendering.render);
2. the layout's HTML is rendered through the same entry point, under the same budgets, with the payload and
   `content` = the template's HTML (already escaped, so inserted as is);
3. every CSS rule of the result is inlined into `style` attributes (css-inline; `<style>` blocks removed,
   remote stylesheets never fetched), since many mail clients drop `<style>`;
4. the text part: the template's text, or, when it has none, text derived from its HTML; placed in the
   layout's text when the layout has one.

Callers that show or send an email call `render` / `render_all` here instead of the ones in rendering.py.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import css_inline
from markupsafe import Markup

from core.categories import category_config
from projects.scoping import current_environment_id
from projects.selectors import sending_settings
from templates_app import rendering
from templates_app.models import LayoutVersion, Template, TemplateVersion
from templates_app.rendering import RenderedParts, RenderError

# One inliner for the process: it is thread-safe. Remote stylesheets are never loaded: a layout is data from
# an API client, and fetching its <link href> would make every send an outgoing request to any address.
_INLINER = css_inline.CSSInliner(load_remote_stylesheets=False, keep_style_tags=False, keep_link_tags=False)


def layout_key_for(version: TemplateVersion) -> str:
    """Return the key of the layout a version's email uses ("" for none): its own, its category's, its project's."""
    if version.layout:
        return version.layout
    default = category_config(version.template.category).get("layout")
    if isinstance(default, str) and default:
        return default
    # The project's, read through the per-process configuration cache: no query per email sent.
    template = version.template
    environment_id = template.environment_id if template.pk is not None else current_environment_id()
    return sending_settings(environment_id).default_layout


def layout_version_current(key: str, *, environment_id: int | None = None) -> LayoutVersion | None:
    """Return the newest version of layout `key` (of `environment_id`, else of the scope), or None when there is none.

    The send workers run outside any scope: they name the environment of the template being sent, since each
    environment has its own layouts under the same keys.
    """
    versions = LayoutVersion.objects.select_related("layout").filter(layout__key=key)
    if environment_id is not None:
        versions = versions.filter(layout__environment_id=environment_id)
    return versions.order_by("-version").first()


def _render_layout_part(
    layout: LayoutVersion, part: str, source: str, *, payload: dict, content: str, link_marker: str
) -> str:
    """Render one part of a layout through the template render entry point (its sandbox and budgets).

    The layout's own `{{ preferences_url }}` stand-in becomes the template rendering's (`link_marker`), so the
    send path, which replaces only that one, puts the recipient's link where the layout's author placed it.
    """
    # An unsaved version is compiled on each call and never enters the compile caches, whose keys are the
    # ids of saved template versions.
    holder = TemplateVersion(
        template=Template(key=f"layout:{layout.layout.key}", category="", default_locale="en"),
        version=layout.version,
        content={"en": {"email": {"subject": "", part: source}}},
    )
    try:
        rendered = rendering.render(holder, channel="email", locale="en", payload={**payload, "content": content})
    except RenderError as exc:
        raise RenderError(
            f"layout {layout}: {exc.message}", variable=exc.variable, path=f"layout.{part}", code=exc.code
        ) from None
    text = str(rendered.parts[part])
    if link_marker and rendered.link_marker:
        text = text.replace(rendered.link_marker, link_marker)
    return text


def inline_css(html: str) -> str:
    """Return `html` with every CSS rule of its `<style>` blocks moved into `style` attributes."""
    try:
        return str(_INLINER.inline(html))
    except Exception as exc:  # css-inline raises its own InlineError (and ValueError) for bad CSS or HTML
        raise RenderError(f"layout: CSS could not be inlined: {exc}", path="layout.html") from None


def compose(layout: LayoutVersion, parts: dict[str, Any], *, payload: dict, link_marker: str = "") -> dict[str, Any]:
    """Return the email parts with the template's HTML inside the layout, CSS inlined, and a text part."""
    out = dict(parts)
    inner_html = str(parts.get("html") or "")
    inner_text = str(parts.get("text") or "")
    content = Markup(inner_html)  # noqa: S704 - rendered by the autoescaping HTML sandbox
    html = _render_layout_part(layout, "html", layout.html, payload=payload, content=content, link_marker=link_marker)
    out["html"] = inline_css(html)
    if layout.text:
        inner_text = inner_text or html_to_text(inner_html)
        out["text"] = _render_layout_part(
            layout, "text", layout.text, payload=payload, content=inner_text, link_marker=link_marker
        )
    else:
        # Derived from the whole laid-out email, so the text part keeps the layout's header and footer.
        out["text"] = inner_text or html_to_text(out["html"])
    return out


def apply(version: TemplateVersion, rendered: RenderedParts, *, channel: str, payload: dict) -> RenderedParts:
    """Return `rendered` laid out when it is an email whose version (or category) has a layout.

    Raises RenderError when the layout named does not exist or does not render.
    """
    if channel != "email":
        return rendered
    key = layout_key_for(version)
    if not key:
        return rendered
    # A saved template's own environment; an unsaved one (a draft previewed in the admin) has none of its own yet.
    environment_id = version.template.environment_id if version.template.pk is not None else None
    layout = layout_version_current(key, environment_id=environment_id)
    if layout is None:
        raise RenderError(f"email layout '{key}' does not exist", path="layout")
    parts = compose(layout, rendered.parts, payload=payload or {}, link_marker=rendered.link_marker)
    return RenderedParts(parts=parts, locale=rendered.locale, link_marker=rendered.link_marker)


def render(version: TemplateVersion, *, channel: str, locale: str, payload: dict) -> RenderedParts:
    """Render a channel of a version like rendering.render, an email inside its layout."""
    rendered = rendering.render(version, channel=channel, locale=locale, payload=payload)
    return apply(version, rendered, channel=channel, payload=payload)


def render_all(version: TemplateVersion, *, locale: str, payload: dict) -> dict[str, RenderedParts]:
    """Render every channel the version serves, the email inside its layout (the previews show this)."""
    return {channel: render(version, channel=channel, locale=locale, payload=payload) for channel in version.channels}


# --- HTML to text --------------------------------------------------------------------------------------

_BLOCKS = frozenset(
    "address article aside blockquote div dl dt dd fieldset figure footer form h1 h2 h3 h4 h5 h6 header hr li "
    "main nav ol p pre section table tr ul".split()
)
# Blocks set apart by a blank line; the other blocks start on a line of their own.
_PARAGRAPHS = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6", "table", "ul", "ol", "blockquote", "pre"})
_SKIPPED = frozenset({"style", "script", "head", "title", "template"})
_SPACES = re.compile(r"[ \t\r\f\v]+")
_BLANK_LINES = re.compile(r"\n{3,}")


class _TextExtractor(HTMLParser):
    """Collect the readable text of an HTML document: blocks on their own lines, links with their address."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.chunks: list[str] = []
        self._skip = 0
        self._links: list[tuple[str, int]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED:
            self._skip += 1
        elif tag == "br":
            self.chunks.append("\n")
        elif tag == "li":
            self.chunks.append("\n- ")
        elif tag in _BLOCKS:
            self.chunks.append("\n\n" if tag in _PARAGRAPHS else "\n")
        elif tag == "a":
            href = dict(attrs).get("href") or ""
            self._links.append((href, len(self.chunks)))
        elif tag == "img":
            alt = dict(attrs).get("alt")
            if alt:
                self.chunks.append(alt)

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCKS and tag != "li":
            self.chunks.append("\n\n" if tag in _PARAGRAPHS else "\n")
        elif tag == "a" and self._links:
            href, start = self._links.pop()
            label = "".join(self.chunks[start:]).strip()
            if href.startswith(("http://", "https://", "mailto:")) and href != label:
                self.chunks.append(f" ({href})" if label else href)

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.chunks.append(_SPACES.sub(" ", data.replace("\n", " ")))


def html_to_text(html: str) -> str:
    """Return a plain-text rendering of `html` for the text part of an email ("" for no HTML)."""
    if not html:
        return ""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    lines = [line.strip() for line in "".join(parser.chunks).split("\n")]
    return _BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()
