"""Figure hygiene: what makes a figure hard to read, found from its plotly JSON alone (no browser, deterministic).

* :func:`text_entities`: HTML entities (``&ge;``, ``&#x27;``, ``&nbsp;``) or tags plotly does not render (it
  renders ``<br>``, ``<b>``, ``<i>``, ``<em>``, ``<sup>``, ``<sub>``, ``<span>`` and ``<a>``) anywhere a reader
  sees text: titles, axis titles, tick labels, annotations, legend names, trace text and hover text.
* :func:`label_overlaps`: two annotations whose boxes overlap. Each box is estimated from the text (its longest
  line and its number of lines) and the font size, at the size the figure is exported (``layout.width`` x
  ``layout.height``, else :data:`EXPORT_SIZE`, the static export's size), placed by its anchor, shifts and arrow
  offset; data coordinates are mapped through the axis range (set, or the traces' extent).
* :func:`method_colors`: two differently named traces (methods) on one figure whose colours are closer than
  :data:`MIN_COLOR_DELTA_E` (CIE76 colour difference in CIELAB; about 2.3 is the smallest difference a
  viewer notices side by side, and lines in a legend need far more) or than :data:`MIN_COLOR_DELTA_E2000`
  (CIEDE2000, :func:`delta_e2000`). CIE76 overrates differences between saturated colours of one hue: a red
  and a red-orange 20.8 apart in CIE76 are 11.7 apart in CIEDE2000, and a reader sees two near-identical reds.
* :func:`log_axis_ticks`: a log axis left to plotly's own ticks, which label 2s and 5s between decades (stray
  labels such as "2 5 10 2 5"); a log axis must set its tick values (or a ``dtick``).
* :func:`hidden_series`: a series every drawn point of which lies (within :data:`HIDDEN_TOL_PX` pixels) under a
  series drawn later on the same axes that covers it (a filled marker at least as large, a solid line at least as
  wide), so the reader sees one series where the legend promises two; unless the figure says so (a legend name,
  annotation or title saying that the series coincide).

* :func:`title_overflows`: a title line too wide for the book's content column (:data:`BOOK_WIDTH_PX`), where a
  browser cuts it at the figure's edge: estimated at :data:`TITLE_EM_PER_CHAR` of the font size per character
  (plotly's default Open Sans), a ``<sup>`` line at its smaller size; put the settings on a ``<br><sup>`` line.
* :func:`table_cells_cut`: a word in a table cell or header wider than its column at the book's width (plotly
  wraps table text only at spaces, so the word is cut at the column's edge).

Beside the figures, :func:`output_raw_entities` reads an executed notebook's HTML, Markdown and printed outputs for
entities a reader would see raw (escaped twice, or in plain text) or that a viewer may show raw (``&nbsp;``).

:func:`figure_problems` runs all seven; :func:`notebook_figures` reads the figures an executed notebook displays.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterator
from typing import Any

#: the size the lab exports static figures at (:func:`moelab.viz.save_figure`'s PNG), for a figure without its own
EXPORT_SIZE = (1000, 560)
#: the smallest CIE76 colour difference allowed between two methods on one figure
MIN_COLOR_DELTA_E = 20.0
#: the smallest CIEDE2000 colour difference allowed between two methods on one figure (checked beside CIE76's)
MIN_COLOR_DELTA_E2000 = 20.0
PLOTLY_MIME = "application/vnd.plotly.v1+json"
# plotly's default margins (px) and annotation arrow offset
_MARGIN = {"l": 80, "r": 80, "t": 100, "b": 80}
_ARROW = (-10.0, -30.0)
_ENTITY = re.compile(r"&(?:[A-Za-z][A-Za-z0-9]{1,31}|#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6});")
_TAG = re.compile(r"</?\s*([A-Za-z][A-Za-z0-9]*)\b[^<>]*>")
_PLOTLY_TAGS = {"br", "b", "i", "em", "sup", "sub", "span", "a", "s", "u", "extra"}  # extra: hover's side box


# ---------------------------------------------------------------------------------------------- text
def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value[:2000]):
            yield from _strings(item, f"{where}[{i}]")


_TEXT_KEYS = ("text", "title", "name", "hovertext", "hovertemplate", "texttemplate", "ticktext", "header", "cells",
              "labels", "legendgrouptitle")


def figure_texts(fig: dict) -> list[tuple[str, str]]:
    """Every piece of text a reader can see in the figure (JSON dict), as ``(where, text)``."""
    out: list[tuple[str, str]] = []
    layout = fig.get("layout", {}) or {}
    for key, value in layout.items():
        if key == "title" or key.startswith(("xaxis", "yaxis", "coloraxis", "legend", "scene", "polar")):
            out += [(f"layout.{key}{w}", t) for w, t in _strings(value, "") if _visible_key(w)]
        elif key in ("annotations", "shapes", "updatemenus", "sliders"):
            out += [(f"layout.{key}{w}", t) for w, t in _strings(value, "") if _visible_key(w)]
    for i, trace in enumerate(fig.get("data", []) or []):
        for key in _TEXT_KEYS:
            if key in trace:
                out += [(f"data[{i}].{key}{w}", t) for w, t in _strings(trace[key], "")]
        for sub in ("marker", "colorbar"):
            if isinstance(trace.get(sub), dict):
                out += [(f"data[{i}].{sub}{w}", t) for w, t in _strings(trace[sub], "") if _visible_key(w)]
    return out


def _visible_key(where: str) -> bool:
    last = where.rsplit(".", 1)[-1].split("[", 1)[0]
    return last in ("text", "title", "ticktext", "name", "label", "hovertext", "hovertemplate") or where == ""


def text_entities(fig: dict) -> list[str]:
    """HTML entities, and tags plotly does not render, in the figure's visible text (``where: snippet``)."""
    problems = []
    for where, text in figure_texts(fig):
        for m in _ENTITY.finditer(text):
            problems.append(f"{where}: HTML entity {m.group(0)!r} in {text[:60]!r}")
        for m in _TAG.finditer(text):
            if m.group(1).lower() not in _PLOTLY_TAGS:
                problems.append(f"{where}: HTML tag {m.group(0)[:30]!r} in {text[:60]!r}")
    return problems


# ---------------------------------------------------------------------------------------------- annotations
def _plain(text: str) -> list[str]:
    """The lines a reader sees: ``<br>`` splits lines, other tags vanish, entities count as one character."""
    lines = re.split(r"<br\s*/?>", text, flags=re.IGNORECASE)
    return [html.unescape(_TAG.sub("", line)) for line in lines]


def _size(fig: dict) -> tuple[float, float, dict[str, float]]:
    layout = fig.get("layout", {}) or {}
    width = float(layout.get("width") or EXPORT_SIZE[0])
    height = float(layout.get("height") or EXPORT_SIZE[1])
    margin = {**_MARGIN, **{k: float(v) for k, v in (layout.get("margin") or {}).items() if k in _MARGIN and v is not None}}
    return width, height, margin


def _axis(layout: dict, ref: str) -> dict:
    name = ref[0] + "axis" + ref[1:].split(" ", 1)[0]
    return layout.get(name, {}) or {}


def _values(raw: Any) -> list[Any]:
    """A trace's data array as a list: plotly 6 writes numpy arrays as ``{"dtype", "bdata"}`` (base64)."""
    if isinstance(raw, dict) and "bdata" in raw and "dtype" in raw:
        import base64  # lazy: only plotly's binary-encoded arrays need it

        import numpy as np  # lazy: this module reads plain JSON; numpy only decodes binary-encoded arrays

        try:
            return np.frombuffer(base64.b64decode(raw["bdata"]), dtype=np.dtype(raw["dtype"])).tolist()
        except (ValueError, TypeError):
            return []
    return list(raw) if isinstance(raw, (list, tuple)) else []


def _data_extent(fig: dict, ref: str) -> tuple[float, float] | None:
    letter = ref[0]
    values: list[float] = []
    for trace in fig.get("data", []) or []:
        if (trace.get(f"{letter}axis") or letter) != ref:
            continue
        for v in _values(trace.get(letter)):
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                values.append(float(v))
    return (min(values), max(values)) if values else None


def _to_fraction(fig: dict, ref: str, value: Any) -> float | None:
    """``value`` on axis ``ref`` (``x``, ``x2``, ``paper``, ``x domain``) as a fraction of the plot area (paper
    coordinates: an axis's fraction is mapped through its ``domain``)."""
    layout = fig.get("layout", {}) or {}
    if ref in ("paper", None):
        try:
            return float(value)
        except (TypeError, ValueError):
            return None
    domain = _axis(layout, ref).get("domain") or [0.0, 1.0]
    inner = _axis_fraction(fig, ref, value)
    return None if inner is None else float(domain[0]) + inner * (float(domain[1]) - float(domain[0]))


def _axis_fraction(fig: dict, ref: str, value: Any) -> float | None:
    """``value`` as a fraction of axis ``ref``'s own extent (``x domain`` values already are one)."""
    if ref.endswith("domain"):
        try:
            return float(value)
        except (TypeError, ValueError):
            return None
    layout = fig.get("layout", {}) or {}
    axis = _axis(layout, ref)
    log = axis.get("type") == "log"
    rng = axis.get("range")
    if not (isinstance(rng, (list, tuple)) and len(rng) == 2 and all(isinstance(r, (int, float)) for r in rng)):
        extent = _data_extent(fig, ref)
        if extent is None or not isinstance(value, (int, float)):
            return None
        lo, hi = extent
        if log:
            if lo <= 0 or hi <= 0:
                return None
            lo, hi = math.log10(lo), math.log10(hi)
        pad = 0.05 * (hi - lo) if hi > lo else 0.5
        rng = (lo - pad, hi + pad)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    v = float(value)
    if log:
        if v <= 0:
            return None
        v = math.log10(v)
    lo, hi = float(rng[0]), float(rng[1])
    return (v - lo) / (hi - lo) if hi != lo else 0.5


def _with_axis_ranges(fig: dict) -> dict:
    """A shallow copy of ``fig`` whose x/y axes used by its traces carry the range plotly would draw where they
    set none (the data extent, padded as :func:`_axis_fraction` pads it): the same fractions, read once."""
    layout = dict(fig.get("layout", {}) or {})
    refs = {str(t.get(f"{letter}axis") or letter) for t in fig.get("data", []) or [] if isinstance(t, dict)
            for letter in "xy"}
    for ref in sorted(refs):
        axis = _axis(layout, ref)
        rng = axis.get("range")
        if isinstance(rng, (list, tuple)) and len(rng) == 2 and all(isinstance(r, (int, float)) for r in rng):
            continue
        extent = _data_extent(fig, ref)
        if extent is None:
            continue
        lo, hi = extent
        if axis.get("type") == "log":
            if lo <= 0 or hi <= 0:
                continue
            lo, hi = math.log10(lo), math.log10(hi)
        pad = 0.05 * (hi - lo) if hi > lo else 0.5
        layout[ref[0] + "axis" + ref[1:]] = {**axis, "range": [lo - pad, hi + pad]}
    return {**fig, "layout": layout}


def annotation_boxes(fig: dict) -> list[tuple[int, str, tuple[float, float, float, float]]]:
    """``(index, text, (x0, y0, x1, y1))`` in pixels of the exported figure for every visible annotation
    whose position can be read (annotations on category axes are skipped)."""
    layout = fig.get("layout", {}) or {}
    width, height, m = _size(fig)
    plot_w, plot_h = max(1.0, width - m["l"] - m["r"]), max(1.0, height - m["t"] - m["b"])
    default_size = float(((layout.get("font") or {}).get("size")) or 12)
    boxes = []
    for i, ann in enumerate(layout.get("annotations", []) or []):
        text = ann.get("text")
        if not text or ann.get("visible") is False:
            continue
        fx = _to_fraction(fig, ann.get("xref", "x"), ann.get("x", 0.5))
        fy = _to_fraction(fig, ann.get("yref", "y"), ann.get("y", 0.5))
        if fx is None or fy is None:
            continue
        if ann.get("xref", "x") == "paper":
            px = m["l"] + fx * plot_w
        else:
            px = m["l"] + fx * plot_w
        py = m["t"] + (1 - fy) * plot_h
        size = float(((ann.get("font") or {}).get("size")) or default_size)
        lines = _plain(str(text))
        w = 0.6 * size * max(len(line) for line in lines) + 2 * float(ann.get("borderpad") or 1)
        h = 1.3 * size * len(lines) + 2 * float(ann.get("borderpad") or 1)
        if ann.get("showarrow", True):
            ax = ann.get("ax", _ARROW[0])
            ay = ann.get("ay", _ARROW[1])
            if ann.get("axref", "pixel") == "pixel" and isinstance(ax, (int, float)):
                px += float(ax)
            if ann.get("ayref", "pixel") == "pixel" and isinstance(ay, (int, float)):
                py += float(ay)
            xanchor, yanchor = ann.get("xanchor", "auto"), ann.get("yanchor", "auto")
            xanchor = "center" if xanchor == "auto" else xanchor
            yanchor = "middle" if yanchor == "auto" else yanchor
        else:
            xanchor, yanchor = ann.get("xanchor", "auto"), ann.get("yanchor", "auto")
            if xanchor == "auto":
                xanchor = "center" if ann.get("xref", "x") != "paper" else ("left" if fx <= 1 / 3 else
                                                                            "right" if fx >= 2 / 3 else "center")
            if yanchor == "auto":
                yanchor = "middle" if ann.get("yref", "y") != "paper" else ("bottom" if fy <= 1 / 3 else
                                                                            "top" if fy >= 2 / 3 else "middle")
        px += float(ann.get("xshift") or 0)
        py -= float(ann.get("yshift") or 0)
        x0 = px - (0 if xanchor == "left" else w if xanchor == "right" else w / 2)
        y0 = py - (0 if yanchor == "top" else h if yanchor == "bottom" else h / 2)
        boxes.append((i, str(text), (x0, y0, x0 + w, y0 + h)))
    return boxes


def _px(fig: dict, ref: str, value: Any, horizontal: bool) -> float | None:
    width, height, m = _size(fig)
    f = _to_fraction(fig, ref, value)
    if f is None:
        return None
    if horizontal:
        return m["l"] + f * max(1.0, width - m["l"] - m["r"])
    return m["t"] + (1 - f) * max(1.0, height - m["t"] - m["b"])


def arrow_segments(fig: dict) -> list[tuple[int, tuple[float, float, float, float]]]:
    """``(index, (x0, y0, x1, y1))`` in pixels for every arrow drawn in data coordinates (``axref``/``ayref``
    on an axis): from its tail ``(ax, ay)`` to its head ``(x, y)``."""
    out = []
    for i, ann in enumerate((fig.get("layout", {}) or {}).get("annotations", []) or []):
        if not ann.get("showarrow", True) or ann.get("axref", "pixel") == "pixel" or ann.get("visible") is False:
            continue
        pts = (_px(fig, ann.get("axref"), ann.get("ax"), True), _px(fig, ann.get("ayref"), ann.get("ay"), False),
               _px(fig, ann.get("xref", "x"), ann.get("x"), True), _px(fig, ann.get("yref", "y"), ann.get("y"), False))
        if None not in pts:
            out.append((i, pts))  # type: ignore[arg-type]
    return out


def _to_segment(px: float, py: float, x0: float, y0: float, x1: float, y1: float) -> float:
    """Distance (px) from a point to a segment: a label anchored on an arrow is that arrow's own label."""
    dx, dy = x1 - x0, y1 - y0
    t = 0.0 if dx == dy == 0 else max(0.0, min(1.0, ((px - x0) * dx + (py - y0) * dy) / (dx * dx + dy * dy)))
    return math.hypot(px - (x0 + t * dx), py - (y0 + t * dy))


def label_overlaps(fig: dict, *, min_overlap_px: float = 2.0) -> list[str]:
    """Pairs of annotations whose estimated boxes overlap by more than ``min_overlap_px`` in both directions,
    and arrows whose shaft (its middle 84%: the ends touch what they connect) runs through a label."""
    boxes = annotation_boxes(fig)
    problems = []
    anns = (fig.get("layout", {}) or {}).get("annotations", []) or []
    for i, (x0, y0, x1, y1) in arrow_segments(fig):
        for j, text, (bx0, by0, bx1, by1) in boxes:
            ann = anns[j]
            ax_, ay_ = _px(fig, ann.get("xref", "x"), ann.get("x"), True), _px(fig, ann.get("yref", "y"), ann.get("y"), False)
            # the arrow's own label: drawn right after it and anchored on its shaft (moelab's diagrams label an
            # arrow so); any other label on the shaft is one the arrow runs through
            own_label = (j == i + 1 and ax_ is not None and ay_ is not None
                         and _to_segment(ax_, ay_, x0, y0, x1, y1) < 3)
            if i == j or own_label:
                continue
            for k in range(8, 93):
                t = k / 100
                px, py = x0 + t * (x1 - x0), y0 + t * (y1 - y0)
                if bx0 + min_overlap_px < px < bx1 - min_overlap_px and by0 + min_overlap_px < py < by1 - min_overlap_px:
                    problems.append(f"the arrow of annotation {i} runs through label {j} {_plain(text)[0][:30]!r}")
                    break
    for a in range(len(boxes)):
        for b in range(a + 1, len(boxes)):
            (i, ti, (ax0, ay0, ax1, ay1)), (j, tj, (bx0, by0, bx1, by1)) = boxes[a], boxes[b]
            dx = min(ax1, bx1) - max(ax0, bx0)
            dy = min(ay1, by1) - max(ay0, by0)
            if dx > min_overlap_px and dy > min_overlap_px:
                problems.append(f"annotations {i} {_plain(ti)[0][:30]!r} and {j} {_plain(tj)[0][:30]!r} overlap "
                                f"({dx:.0f} x {dy:.0f} px at {EXPORT_SIZE[0]} x {EXPORT_SIZE[1]})")
    return problems


# ---------------------------------------------------------------------------------------------- colours
def _rgb(color: str) -> tuple[float, float, float] | None:
    c = color.strip().lower()
    if re.fullmatch(r"#[0-9a-f]{6}", c):
        return tuple(int(c[k:k + 2], 16) / 255 for k in (1, 3, 5))  # type: ignore[return-value]
    if re.fullmatch(r"#[0-9a-f]{3}", c):
        return tuple(int(ch * 2, 16) / 255 for ch in c[1:])  # type: ignore[return-value]
    m = re.fullmatch(r"rgba?\(\s*([\d.]+)\s*,\s*([\d.]+)\s*,\s*([\d.]+)\s*(?:,\s*([\d.]+)\s*)?\)", c)
    if m:
        return tuple(float(m.group(k)) / 255 for k in (1, 2, 3))  # type: ignore[return-value]
    return None


def _lab(rgb: tuple[float, float, float]) -> tuple[float, float, float]:
    def lin(u: float) -> float:
        return u / 12.92 if u <= 0.04045 else ((u + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(u) for u in rgb)
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116

    fx, fy, fz = f(x), f(y), f(z)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def delta_e(a: str, b: str) -> float | None:
    """CIE76 colour difference between two CSS colours (hex or rgb()), None when one cannot be read."""
    ra, rb = _rgb(a), _rgb(b)
    if ra is None or rb is None:
        return None
    return math.dist(_lab(ra), _lab(rb))


def delta_e2000(a: str, b: str) -> float | None:
    """CIEDE2000 colour difference between two CSS colours (hex or rgb()), None when one cannot be read.

    Unlike CIE76 (:func:`delta_e`) it weighs lightness, chroma and hue differences as a viewer sees them
    (Sharma, Wu and Dalal 2005): saturated colours of one hue come out close, as they look.
    """
    ra, rb = _rgb(a), _rgb(b)
    if ra is None or rb is None:
        return None
    return _ciede2000(_lab(ra), _lab(rb))


def _ciede2000(lab1: tuple[float, float, float], lab2: tuple[float, float, float]) -> float:
    """CIEDE2000 between two CIELAB colours (Sharma, Wu and Dalal 2005, their equations 1 to 22)."""
    (l1, a1, b1), (l2, a2, b2) = lab1, lab2
    c_mean = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_mean ** 7 / (c_mean ** 7 + 25.0 ** 7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1p = math.degrees(math.atan2(b1, a1p)) % 360 if c1p else 0.0
    h2p = math.degrees(math.atan2(b2, a2p)) % 360 if c2p else 0.0
    dhp = 0.0 if c1p * c2p == 0 else (h2p - h1p + 180) % 360 - 180
    d_l, d_c = l2 - l1, c2p - c1p
    d_h = 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dhp / 2))
    l_mean, cp_mean = (l1 + l2) / 2, (c1p + c2p) / 2
    if c1p * c2p == 0:
        h_mean = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        h_mean = (h1p + h2p) / 2
    else:
        h_mean = (h1p + h2p + (360 if h1p + h2p < 360 else -360)) / 2
    t = (1 - 0.17 * math.cos(math.radians(h_mean - 30)) + 0.24 * math.cos(math.radians(2 * h_mean))
         + 0.32 * math.cos(math.radians(3 * h_mean + 6)) - 0.20 * math.cos(math.radians(4 * h_mean - 63)))
    d_theta = 30 * math.exp(-(((h_mean - 275) / 25) ** 2))
    r_c = 2 * math.sqrt(cp_mean ** 7 / (cp_mean ** 7 + 25.0 ** 7))
    s_l = 1 + 0.015 * (l_mean - 50) ** 2 / math.sqrt(20 + (l_mean - 50) ** 2)
    s_c, s_h = 1 + 0.045 * cp_mean, 1 + 0.015 * cp_mean * t
    r_t = -math.sin(math.radians(2 * d_theta)) * r_c
    return math.sqrt((d_l / s_l) ** 2 + (d_c / s_c) ** 2 + (d_h / s_h) ** 2 + r_t * (d_c / s_c) * (d_h / s_h))


def colors_too_close(a: str, b: str, *, min_delta_e: float = MIN_COLOR_DELTA_E,
                     min_delta_e2000: float = MIN_COLOR_DELTA_E2000) -> str | None:
    """Why two methods' colours ``a`` and ``b`` cannot share a figure (closer than ``min_delta_e`` in CIE76 or
    than ``min_delta_e2000`` in CIEDE2000), or None when they can (or a colour cannot be read)."""
    d76, d00 = delta_e(a, b), delta_e2000(a, b)
    if d76 is None or d00 is None:
        return None
    if d76 < min_delta_e:
        return f"{d76:.1f} apart (CIE76), under {min_delta_e:g}"
    if d00 < min_delta_e2000:
        return f"{d00:.1f} apart (CIEDE2000), under {min_delta_e2000:g}"
    return None


def _trace_color(trace: dict) -> str | None:
    for key in ("marker", "line"):
        color = (trace.get(key) or {}).get("color")
        if isinstance(color, str):
            return color
    color = trace.get("fillcolor")
    return color if isinstance(color, str) else None


def _method(trace: dict) -> str:
    """The method a trace draws: its legend group (``qwen3 (fit)`` and ``qwen3 (measured)`` in one group are one
    method drawn two ways, in one colour on purpose), else its name."""
    group = trace.get("legendgroup")
    return str(group) if group else str(trace.get("name"))


def method_colors(fig: dict, *, min_delta_e: float = MIN_COLOR_DELTA_E,
                  min_delta_e2000: float = MIN_COLOR_DELTA_E2000) -> list[str]:
    """Two methods in the legend of one subplot whose colours differ by less than ``min_delta_e`` (CIE76) or
    ``min_delta_e2000`` (CIEDE2000): :func:`colors_too_close`."""
    per_axes: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
    if (fig.get("layout", {}) or {}).get("showlegend") is False:
        return []  # no legend: traces are told apart by their axis labels or annotations, not by colour
    for trace in fig.get("data", []) or []:
        name, color = trace.get("name"), _trace_color(trace)
        if not name or color is None or trace.get("showlegend") is False or trace.get("visible") is False:
            continue
        axes = (str(trace.get("xaxis") or "x"), str(trace.get("yaxis") or "y"))
        per_axes.setdefault(axes, {}).setdefault(_method(trace), (str(name), color))
    problems = []
    for named in per_axes.values():
        items = sorted(named.values())
        for a in range(len(items)):
            for b in range(a + 1, len(items)):
                why = colors_too_close(items[a][1], items[b][1], min_delta_e=min_delta_e,
                                       min_delta_e2000=min_delta_e2000)
                if why is not None:
                    problems.append(f"{items[a][0]!r} ({items[a][1]}) and {items[b][0]!r} ({items[b][1]}) are {why}")
    return problems


# ---------------------------------------------------------------------------------------------- axes
def log_axis_ticks(fig: dict) -> list[str]:
    """Log axes left to plotly's own tick labels (which add 2s and 5s between decades)."""
    problems = []
    for key, axis in (fig.get("layout", {}) or {}).items():
        if not re.fullmatch(r"[xy]axis\d*", key) or not isinstance(axis, dict) or axis.get("type") != "log":
            continue
        if axis.get("tickvals") is None and axis.get("dtick") is None and axis.get("showticklabels") is not False:
            problems.append(f"{key} is a log axis without tickvals or dtick (plotly labels 2s and 5s between decades)")
    return problems


# ---------------------------------------------------------------------------------------------- hidden series
#: two points closer than this (pixels of the exported figure, :data:`EXPORT_SIZE`) are drawn on one another
HIDDEN_TOL_PX = 2.0
# words with which a figure tells the reader that series coincide (in a legend name, an annotation or the title)
_SAYS_COINCIDE = re.compile(r"coincid|identical|hidden|overlap|on top of|beneath|underneath|same (?:as|points|line|values)"
                            r"|\(=", re.IGNORECASE)


def _mode(trace: dict, n: int) -> set[str]:
    mode = trace.get("mode")
    if not isinstance(mode, str):  # plotly's default: lines+markers under 20 points, lines from 20 on
        mode = "lines+markers" if n < 20 else "lines"
    return set(mode.split("+")) - {"none"}


def _points(fig: dict, trace: dict) -> list[tuple[float, float]] | None:
    """The trace's drawn points in pixels of the exported figure (category values as their own coordinate),
    or None when a point cannot be placed."""
    ys = _values(trace.get("y"))
    xs = _values(trace.get("x")) if trace.get("x") is not None else list(range(len(ys)))
    xref, yref = str(trace.get("xaxis") or "x"), str(trace.get("yaxis") or "y")
    out = []
    for x, y in zip(xs, ys):
        if x is None or y is None or (isinstance(x, float) and not math.isfinite(x)) or (
                isinstance(y, float) and not math.isfinite(y)):
            continue  # a gap: nothing drawn
        px = _px(fig, xref, x, True) if isinstance(x, (int, float)) and not isinstance(x, bool) else None
        py = _px(fig, yref, y, False) if isinstance(y, (int, float)) and not isinstance(y, bool) else None
        if (px is None and not isinstance(x, str)) or (py is None and not isinstance(y, str)):
            return None
        out.append((px if px is not None else x, py if py is not None else y))  # type: ignore[arg-type]
    return out


def _near(p: tuple[Any, Any], q: tuple[Any, Any], tol: float) -> bool:
    for a, b in zip(p, q):
        if isinstance(a, str) or isinstance(b, str):
            if a != b:
                return False
        elif abs(a - b) > tol:
            return False
    return True


def _cell(p: tuple[Any, Any], tol: float) -> tuple[Any, Any]:
    return tuple(v if isinstance(v, str) else math.floor(v / tol) for v in p)  # type: ignore[return-value]


def _covered(points: list, by: list, tol: float) -> bool:
    """Whether every point of ``points`` is within ``tol`` of one of ``by`` (a grid of ``tol`` cells: each point
    is compared with the points of its own and the neighbouring cells only)."""
    grid: dict[tuple[Any, Any], list] = {}
    for q in by:
        grid.setdefault(_cell(q, tol), []).append(q)
    for p in points:
        cx, cy = _cell(p, tol)
        near = [(cx + dx if not isinstance(cx, str) else cx, cy + dy if not isinstance(cy, str) else cy)
                for dx in (-1, 0, 1) for dy in (-1, 0, 1)]
        if not any(_near(p, q, tol) for c in dict.fromkeys(near) for q in grid.get(c, ())):
            return False
    return True


def _opacity(trace: dict) -> float:
    """The lowest opacity the trace's markers are drawn with (the trace's and its markers')."""
    values = [trace.get("opacity", 1), (trace.get("marker") or {}).get("opacity", 1)]
    return min(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 1.0 for v in values)


def _marker(trace: dict) -> tuple[float, bool]:
    """(size, open symbol) of the trace's markers (the largest size, whether any symbol is open)."""
    marker = trace.get("marker") or {}
    sizes = marker.get("size", 6)
    sizes = [v for v in (_values(sizes) if not isinstance(sizes, (int, float)) else [sizes]) if isinstance(v, (int, float))]
    symbols = marker.get("symbol", "circle")
    symbols = symbols if isinstance(symbols, list) else [symbols]
    is_open = any((isinstance(sym, str) and "open" in sym) or (isinstance(sym, (int, float)) and int(sym) % 400 >= 100)
                  for sym in symbols)
    return (max(sizes) if sizes else 6.0), is_open


def _line(trace: dict) -> tuple[float, bool]:
    """(width, solid) of the trace's line."""
    line = trace.get("line") or {}
    width = line.get("width", 2)
    dash = line.get("dash")
    return (float(width) if isinstance(width, (int, float)) else 2.0), dash in (None, "solid")


def _hides(top: dict, below: dict, pts_top: list, pts_below: list, tol: float) -> bool:
    """Whether ``top`` (drawn later) covers everything ``below`` draws."""
    m_top, m_below = _mode(top, len(pts_top)), _mode(below, len(pts_below))
    if not m_below or "text" in m_below or below.get("fill") not in (None, "none") or any(
            isinstance(below.get(e), dict) and below[e].get("visible", True) is not False and below[e].get("array")
            is not None for e in ("error_x", "error_y")):
        return False  # text, a filled area or error bars stay visible
    if not _covered(pts_below, pts_top, tol):
        return False
    if _opacity(top) < 0.9:
        return False  # a translucent trace on top shows what is beneath
    if "markers" in m_below:
        size_top, open_top = _marker(top)
        if "markers" not in m_top or open_top or size_top < 0.9 * _marker(below)[0]:
            return False  # an open or smaller marker on top leaves the one below visible
    if "lines" in m_below and len(pts_below) > 1:
        width_top, solid_top = _line(top)
        if "lines" not in m_top or not solid_top or width_top < _line(below)[0] or not _covered(pts_top, pts_below, tol):
            return False  # a thinner, dashed or differently routed line on top leaves the one below visible
    return True


def _says_so(fig: dict, below: dict, top: dict) -> bool:
    """Whether the figure tells the reader that ``below`` lies under ``top`` (a legend name or a visible text that
    says the series coincide)."""
    layout = fig.get("layout", {}) or {}
    texts = [str(t.get("name") or "") for t in (below, top)]
    texts += [str(a.get("text") or "") for a in layout.get("annotations", []) or [] if isinstance(a, dict)]
    title = layout.get("title")
    texts.append(str(title.get("text") if isinstance(title, dict) else title or ""))
    legend = (layout.get("legend") or {}).get("title")
    texts.append(str(legend.get("text") if isinstance(legend, dict) else legend or ""))
    return any(_SAYS_COINCIDE.search(" ".join(_plain(t))) for t in texts if t)


def hidden_series(fig: dict, *, tol_px: float = HIDDEN_TOL_PX) -> list[str]:
    """Series (scatter traces) whose every drawn point lies, within ``tol_px`` pixels of the exported figure, under a
    trace drawn later on the same axes that covers what it draws (a filled marker at least as large, a solid line at
    least as wide along the same points), unless the figure says so (a legend name, annotation or title saying that
    series coincide, are identical, overlap...)."""
    # every point of every trace is placed through its axes' ranges: read each unset range from the data once
    # (recomputing it per point made one figure of thousands of points take minutes)
    fig = _with_axis_ranges(fig)
    traces = []
    for i, trace in enumerate(fig.get("data", []) or []):
        if not isinstance(trace, dict) or trace.get("type", "scatter") not in ("scatter", "scattergl"):
            continue
        if trace.get("visible", True) is not True:
            continue
        pts = _points(fig, trace)
        if pts:
            traces.append((i, trace, pts, (str(trace.get("xaxis") or "x"), str(trace.get("yaxis") or "y"))))
    problems = []
    for a, (i, below, pts_below, axes_below) in enumerate(traces):
        for j, top, pts_top, axes_top in traces[a + 1:]:
            if axes_top == axes_below and _hides(top, below, pts_top, pts_below, tol_px) and not _says_so(fig, below, top):
                problems.append(f"trace {i} {str(below.get('name') or '')[:30]!r} is hidden under trace {j} "
                                f"{str(top.get('name') or '')[:30]!r} (every point within {tol_px:g} px, drawn beneath it)")
                break
    return problems


#: the book's content column (px) in a 1280-px-wide browser window: a figure without a width of its own is drawn
#: this wide on a chapter page
BOOK_WIDTH_PX = 688
#: the mean width of a title character in plotly's default font (Open Sans), as a share of the font size, on the
#: generous side: on the book's pages an 84-character title at 17 px ran past 700 px
TITLE_EM_PER_CHAR = 0.5
_TITLE_FONT_PX = 17.0  # plotly's default title size
_SUP_SCALE = 0.7  # a <sup> line's size relative to the title's


def title_overflows(fig: dict, width_px: float = BOOK_WIDTH_PX) -> list[str]:
    """Title lines (split at ``<br>``) estimated wider than the figure's plotting width (``layout.width`` or
    ``width_px``, less the title's left offset), each as ``title: line (estimated px > available px)``."""
    layout = fig.get("layout", {}) or {}
    title = layout.get("title")
    text = title.get("text") if isinstance(title, dict) else title
    if not text:
        return []
    size = float(((title.get("font") or {}).get("size") if isinstance(title, dict) else None) or _TITLE_FONT_PX)
    x = float((title.get("x") if isinstance(title, dict) else None) or 0.05)  # plotly_white's default offset
    available = float(layout.get("width") or width_px) * (1 - min(max(x, 0.0), 0.5))
    problems = []
    for line in re.split(r"<br\s*/?>", str(text)):
        scale = _SUP_SCALE if "<sup>" in line else 1.0
        plain = re.sub(r"<[^>]+>", "", line)
        est = TITLE_EM_PER_CHAR * size * scale * len(plain)
        if est > available:
            problems.append(f"title: {plain[:60]!r}... ({est:.0f} px estimated > {available:.0f} px)")
    return problems


#: a table character's mean width as a share of its font size (12-px Arial measures 6.1 px for a digit and 5.9 px
#: for a lowercase letter in Chromium; a little more leaves room for wide letters), and a cell's padding (px)
TABLE_EM_PER_CHAR = 6.4 / 12
TABLE_CELL_PAD_PX = 16.0
_TABLE_FONT_PX = 12.0  # plotly's default table font size
_PLOTLY_SIDE_MARGIN = 80.0  # plotly's default left and right margins (px)


def table_cells_cut(fig: dict, width_px: float = BOOK_WIDTH_PX) -> list[str]:
    """Table words estimated wider than their column at the figure's width (``layout.width`` or ``width_px``),
    each as ``table: column N: 'word' (estimated px > column px)``. Plotly wraps a cell or header only at spaces
    and ``<br>``, so a longer word is cut at the column's edge (05's costs table cut "sglang_minimum_tokens" at a
    1280-px window). Columns share the plotting width in proportion to ``columnwidth`` (equal where unset)."""
    layout = fig.get("layout", {}) or {}
    margin = layout.get("margin") or {}
    room = float(layout.get("width") or width_px) - float(margin.get("l", _PLOTLY_SIDE_MARGIN)) \
        - float(margin.get("r", _PLOTLY_SIDE_MARGIN))
    problems = []
    for trace in fig.get("data", []) or []:
        if trace.get("type") != "table":
            continue
        parts = [((trace.get(part) or {}).get("values") or [], (trace.get(part) or {}).get("font") or {})
                 for part in ("header", "cells")]
        n = max(len(values) for values, _ in parts)
        if n == 0:
            continue
        rel = trace.get("columnwidth")
        rel = [float(v) for v in rel] if isinstance(rel, (list, tuple)) and len(rel) else [1.0]
        rel = (rel * n)[:n] if len(rel) < n else rel[:n]
        cols = [room * r / sum(rel) for r in rel]
        for values, font in parts:
            size = float(font.get("size") or _TABLE_FONT_PX) if isinstance(font, dict) else _TABLE_FONT_PX
            for i, column in enumerate(values):
                texts = column if isinstance(column, (list, tuple)) else [column]
                for text in texts:
                    for line in re.split(r"<br\s*/?>", str(text)):
                        for word in re.sub(r"<[^>]+>", "", line).split():
                            est = TABLE_EM_PER_CHAR * size * len(word) + TABLE_CELL_PAD_PX
                            if est > cols[i]:
                                problems.append(f"table: column {i}: {word[:40]!r} ({est:.0f} px estimated > "
                                                f"{cols[i]:.0f} px)")
    return sorted(set(problems))


def figure_problems(fig: Any) -> dict[str, list[str]]:
    """All seven checks on a figure (a ``go.Figure`` or its JSON dict)."""
    if not isinstance(fig, dict):
        fig = fig.to_plotly_json()
    return {"text_entities": text_entities(fig), "label_overlaps": label_overlaps(fig),
            "method_colors": method_colors(fig), "log_axis_ticks": log_axis_ticks(fig),
            "hidden_series": hidden_series(fig), "title_overflows": title_overflows(fig),
            "table_cells_cut": table_cells_cut(fig)}


# ---------------------------------------------------------------------------------------------- HTML outputs
#: the entities an HTML output needs to escape its text once (everything else is written as the character itself)
STRUCTURAL_ENTITIES = frozenset({"&amp;", "&lt;", "&gt;", "&quot;"})
_DOUBLE_ESCAPED = re.compile(r"&amp;(?:[A-Za-z][A-Za-z0-9]{1,31}|#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6});")


def _joined(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value or "")


def output_raw_entities(executed: dict) -> list[str]:
    """Entities a reader of the executed notebook would see raw, or that a viewer may show raw, in its outputs
    (figures are :func:`text_entities`'s): in an HTML or Markdown output, an entity escaped twice (``&amp;#x27;``
    reads as ``&#x27;``) or any entity besides the :data:`STRUCTURAL_ENTITIES` that escaping text once needs
    (``&nbsp;``, ``&#x27;``, ``&#8629;``: write the character itself, or spacing as CSS); in printed text, any entity
    (nothing renders it)."""
    problems = []
    for i, cell in enumerate(executed.get("cells", [])):
        for output in cell.get("outputs", []) or []:
            data = output.get("data") or {}
            items = [("stream", output.get("text"))] if output.get("output_type") == "stream" else [
                (mime, data[mime]) for mime in ("text/html", "text/markdown") if mime in data]
            if output.get("output_type") != "stream" and not items and "text/plain" in data:
                items = [("text/plain", data["text/plain"])]  # shown as it is: nothing renders an entity
            for mime, value in items:
                text = _joined(value)
                for m in _DOUBLE_ESCAPED.finditer(text):
                    problems.append(f"cell {i} {mime}: entity escaped twice {m.group(0)!r} (shows as "
                                    f"{html.unescape(m.group(0))!r}) in {text[max(0, m.start() - 30):m.end() + 10]!r}")
                rendered = mime in ("text/html", "text/markdown")
                for m in _ENTITY.finditer(_DOUBLE_ESCAPED.sub(" ", text)):
                    if rendered and m.group(0) in STRUCTURAL_ENTITIES:
                        continue
                    problems.append(f"cell {i} {mime}: HTML entity {m.group(0)!r} "
                                    + ("(write the character itself, or spacing as CSS)" if rendered else
                                       "in printed text (shown raw)"))
    return problems


#: a cell's value that is an object's repr rather than something to read: a path a call returned
_STRAY_REPR = re.compile(r"^(?:Posix|Windows|Pure\w*)?Path\(['\"]")


def output_stray_values(executed: dict) -> list[str]:
    """A cell's displayed value that is a return value nobody meant to show: an ``execute_result`` whose only
    readable form is a path's repr (``PosixPath('/tmp/.../03_afd_ratio.json')``, a call such as
    ``write_results`` ending its cell), which also leaks the machine's folders into the book."""
    problems = []
    for i, cell in enumerate(executed.get("cells", [])):
        for output in cell.get("outputs", []) or []:
            data = output.get("data") or {}
            if output.get("output_type") != "execute_result" or set(data) - {"text/plain"}:
                continue
            text = _joined(data.get("text/plain", "")).strip()
            if _STRAY_REPR.match(text):
                problems.append(f"cell {i}: its value {text[:80]!r} is shown (end the line with ';' or assign it)")
    return problems


_MISSING_CELL = re.compile(r"<td[^>]*>\s*(NaN|nan|&lt;NA&gt;|None|NaT)\s*</td>")


def output_missing_markers(executed: dict) -> list[str]:
    """HTML table cells of an executed notebook that show pandas' or Python's missing-value markers (``NaN``,
    ``<NA>``, ``None``, ``NaT``) as if they were values; :func:`moelab.viz.readable` shows them as a dash."""
    problems = []
    for i, cell in enumerate(executed.get("cells", [])):
        for output in cell.get("outputs", []) or []:
            found = _MISSING_CELL.findall(_joined((output.get("data") or {}).get("text/html", "")))
            if found:
                problems.append(f"cell {i}: {len(found)} table cells show {sorted(set(found))} (show the table "
                                "through moelab.viz.readable)")
    return problems


def notebook_figures(executed: dict) -> list[tuple[int, dict]]:
    """``(cell index, figure JSON)`` for every plotly figure an executed notebook (JSON) displays."""
    out = []
    for i, cell in enumerate(executed.get("cells", [])):
        for output in cell.get("outputs", []) or []:
            data = (output.get("data") or {}).get(PLOTLY_MIME)
            if isinstance(data, dict):
                out.append((i, data))
    return out


def _figure_name(fig: dict, fallback: str) -> str:
    meta = (fig.get("layout") or {}).get("meta")
    if isinstance(meta, dict):
        for value in meta.values():
            if isinstance(value, str):
                return value
    title = (fig.get("layout") or {}).get("title")
    text = title.get("text") if isinstance(title, dict) else title
    return str(text)[:50] if text else fallback


def notebook_figure_problems(executed: dict) -> dict[str, list[str]]:
    """Every problem of every figure an executed notebook displays, per check, each prefixed with the figure."""
    found: dict[str, list[str]] = {kind: [] for kind in figure_problems({})}
    for cell, fig in notebook_figures(executed):
        name = _figure_name(fig, f"cell {cell}")
        for kind, problems in figure_problems(fig).items():
            found[kind] += [f"{name}: {p}" for p in problems]
    return found


__all__ = ["BOOK_WIDTH_PX", "EXPORT_SIZE", "HIDDEN_TOL_PX", "TITLE_EM_PER_CHAR", "MIN_COLOR_DELTA_E", "MIN_COLOR_DELTA_E2000", "annotation_boxes",
           "arrow_segments", "colors_too_close", "delta_e", "delta_e2000",
           "STRUCTURAL_ENTITIES", "figure_problems", "figure_texts", "hidden_series", "label_overlaps", "log_axis_ticks",
           "method_colors", "notebook_figure_problems", "notebook_figures", "output_missing_markers", "output_raw_entities",
           "output_stray_values", "text_entities",
           "TABLE_EM_PER_CHAR", "TABLE_CELL_PAD_PX", "table_cells_cut", "title_overflows"]
