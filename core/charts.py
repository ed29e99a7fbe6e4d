"""Small server-side SVG charts for the admin (no library, no CDN, no script): lines over time and bars.

Every label is escaped; the SVG is built from numbers and escaped text only, so it is safe to mark safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape

from django.utils.safestring import SafeString, mark_safe

# Colour per series name where the name means something (a status, a breaker state); others cycle.
COLOURS: dict[str, str] = {
    "sent": "#417690",
    "delivered": "#2e8b57",
    "opened": "#6a5acd",
    "failed": "#ba2121",
    "bounced": "#d2691e",
    "suppressed": "#c8a200",
    "deferred": "#999999",
    "closed": "#2e8b57",
    "half_open": "#c8a200",
    "open": "#ba2121",
}
CYCLE = ("#417690", "#2e8b57", "#ba2121", "#c8a200", "#6a5acd", "#d2691e", "#20b2aa", "#8b4513")


def colour(name: str, index: int) -> str:
    """Return the colour of a series."""
    return COLOURS.get(name) or CYCLE[index % len(CYCLE)]


def _nice_max(value: float) -> float:
    """Round an axis maximum up to 1, 2 or 5 times a power of ten."""
    if value <= 0:
        return 1
    power = 10 ** (len(str(int(value))) - 1)
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)


def _runs(values: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """Split a series at its gaps (None): the runs of consecutive (index, value) points."""
    runs: list[list[tuple[int, float]]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((i, v))
    return [run for run in runs if run]


def _legend(entries: Sequence[tuple[str, str]], *, x: float, y: float) -> str:
    """Return a legend row: a coloured square and the escaped name per (name, colour)."""
    parts = []
    for name, c in entries:
        parts.append(
            f'<rect x="{x}" y="{y}" width="10" height="10" fill="{c}"/>'
            f'<text x="{x + 14}" y="{y + 9}" font-size="11" class="legend">{escape(name)}</text>'
        )
        x += 24 + 7 * len(name)
    return "".join(parts)


def line_chart(
    series: Mapping[str, Sequence[float | None]],
    *,
    labels: Sequence[datetime],
    title: str,
    width: int = 720,
    height: int = 200,
    unit: str = "",
) -> SafeString:
    """Draw one polyline per series over shared time labels, with a y axis, a time axis and a legend.

    A None value is a gap (no measurement): the line breaks there; a point alone between gaps is a dot.
    """
    left, right, top, bottom = 48, 24, 24, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    n = max(len(labels), 1)
    peak = _nice_max(
        max((max((v for v in values if v is not None), default=0) for values in series.values()), default=0)
    )

    def x(i: int) -> float:
        return left + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y(v: float) -> float:
        return top + plot_h - plot_h * (v / peak)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" aria-label="{escape(title)}">',
        f'<text x="{left}" y="15" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    for k in range(5):
        v = peak * k / 4
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e5e5e5"/>'
            f'<text x="{left - 4}" y="{y(v) + 4:.1f}" font-size="10" text-anchor="end">{v:g}{escape(unit)}</text>'
        )
    if labels:
        for i in sorted({0, n // 4, n // 2, 3 * n // 4, n - 1}):
            parts.append(
                f'<text x="{x(i):.1f}" y="{height - bottom + 14}" font-size="10" text-anchor="middle">'
                f"{labels[i]:%H:%M}</text>"
            )
    for index, (name, values) in enumerate(series.items()):
        c = colour(name, index)
        for run in _runs(values):
            if len(run) == 1:
                i, v = run[0]
                parts.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="2" fill="{c}"/>')
                continue
            points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in run)
            parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{points}"/>')
    parts.append(_legend([(name, colour(name, i)) for i, name in enumerate(series)], x=left, y=height - 14))
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - numbers and escaped text only


def state_strip(
    rows: Mapping[str, Sequence[str | None]],
    *,
    labels: Sequence[datetime],
    title: str,
    width: int = 470,
) -> SafeString:
    """Draw one band per row over shared time labels, each slot coloured by its state (blank: not known)."""
    row_h, left, right, top = 20, 110, 16, 24
    plot_w = width - left - right
    n = max(len(labels), 1)
    states = sorted({s for values in rows.values() for s in values if s})
    height = top + row_h * max(len(rows), 1) + 34
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart state-strip" role="img" width="{width}"'
        f' height="{height}" viewBox="0 0 {width} {height}" aria-label="{escape(title)}">',
        f'<text x="4" y="15" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    slot = plot_w / n
    for r, (name, values) in enumerate(rows.items()):
        y = top + r * row_h
        parts.append(f'<text x="{left - 6}" y="{y + 14}" font-size="11" text-anchor="end">{escape(name)}</text>')
        parts.append(f'<rect x="{left}" y="{y + 3}" width="{plot_w}" height="{row_h - 6}" fill="#f3f3f3"/>')
        for i, state in enumerate(values):
            if state:
                parts.append(
                    f'<rect class="slot" x="{left + slot * i:.1f}" y="{y + 3}" width="{slot + 0.3:.1f}"'
                    f' height="{row_h - 6}" fill="{COLOURS.get(state, "#999999")}" data-state="{escape(state)}"/>'
                )
    if not rows:
        parts.append(f'<text x="4" y="{top + 14}" font-size="11">no samples yet</text>')
    axis_y = top + row_h * max(len(rows), 1) + 12
    if labels:
        for i in sorted({0, n // 2, n - 1}):
            parts.append(f'<text x="{left + slot * i:.1f}" y="{axis_y}" font-size="10">{labels[i]:%H:%M}</text>')
    parts.append(_legend([(state, COLOURS.get(state, "#999999")) for state in states], x=left, y=height - 14))
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - numbers and escaped text only


def bar_chart(
    values: Mapping[str, float],
    *,
    title: str,
    width: int = 360,
    colours: Mapping[str, str] | None = None,
    unit: str = "",
    show_values: bool = True,
) -> SafeString:
    """Draw horizontal bars, one per label, with the value written at the end of each (unless not wanted)."""
    row, left, top = 22, 130, 24
    height = top + row * max(len(values), 1) + 8
    peak = max(values.values(), default=0) or 1
    plot_w = width - left - 60
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" aria-label="{escape(title)}">',
        f'<text x="4" y="15" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    for i, (label, value) in enumerate(values.items()):
        y = top + i * row
        w = plot_w * value / peak
        c = (colours or {}).get(label) or colour(label, i)
        parts.append(
            f'<text x="{left - 6}" y="{y + 14}" font-size="11" text-anchor="end">{escape(label)}</text>'
            f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 8}" fill="{c}"/>'
            + (
                f'<text x="{left + w + 4:.1f}" y="{y + 14}" font-size="11">{value:g}{escape(unit)}</text>'
                if show_values
                else ""
            )
        )
    if not values:
        parts.append(f'<text x="4" y="{top + 14}" font-size="11">no data</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - numbers and escaped text only
