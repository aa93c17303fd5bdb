"""Line charts as inline SVG, drawn on the server: no chart library, nothing to fetch."""

from __future__ import annotations

import math
from html import escape
from typing import Any

from markupsafe import Markup

COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")


def series_from(records: list[dict[str, Any]], keys: list[str]) -> dict[str, list[tuple[float, float]]]:
    """metric -> (step, value) points, for the keys present in the records (non-finite values skipped)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for key in keys:
        points = [(float(r["step"]), float(r[key])) for r in records
                  if key in r and isinstance(r[key], int | float) and math.isfinite(r[key])]
        if points:
            out[key] = points
    return out


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], *, width: int = 420,
               height: int = 170) -> Markup:
    """One panel: a polyline (and dots) per series, y range and x range labelled, a legend."""
    points = [p for s in series.values() for p in s]
    if not points:
        return Markup(f'<figure class="chart empty"><figcaption>{escape(title)}</figcaption>'
                      f'<p class="muted">no data yet</p></figure>')
    left, right, top, bottom = 46, 10, 8, 22
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * plot_h

    parts = [f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="{escape(title)}">',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="plot"/>',
             f'<text x="{left - 4}" y="{top + 8}" class="tick" text-anchor="end">{_fmt(y1)}</text>',
             f'<text x="{left - 4}" y="{top + plot_h}" class="tick" text-anchor="end">{_fmt(y0)}</text>',
             f'<text x="{left}" y="{height - 6}" class="tick">{_fmt(x0)}</text>',
             f'<text x="{left + plot_w}" y="{height - 6}" class="tick" text-anchor="end">step {_fmt(x1)}</text>']
    legend = []
    for i, (name, pts) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.6" '
                     f'data-series="{escape(name)}" data-points="{len(pts)}"/>')
        if len(pts) <= 60:
            parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.2" fill="{color}">'
                      f'<title>{escape(name)} step {_fmt(x)}: {y:.4g}</title></circle>' for x, y in pts]
        legend.append(f'<span class="key" style="--c:{color}">{escape(name)} <b>{pts[-1][1]:.4g}</b></span>')
    parts.append("</svg>")
    return Markup(f'<figure class="chart"><figcaption>{escape(title)}</figcaption>{"".join(parts)}'
                  f'<div class="legend">{"".join(legend)}</div></figure>')
