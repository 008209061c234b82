"""Figure output and widget helpers shared by every notebook."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import shutil
from copy import deepcopy
from pathlib import Path
from typing import Any

import ipywidgets as w
import numpy as np
import pandas as pd

from moelab._io import atomic_write_bytes, atomic_write_json, atomic_write_text
from moelab.datasets import repo_root
from moelab.viz.hygiene import colors_too_close

#: One colour per router / method / model name, used by every figure of the lab (look names up with
#: :func:`color_for`, which is case-insensitive and gives unknown names a stable colour of their own).
#: Convention: each paper's proposed method is red (eldr, hd, br0), plain autoregressive decoding and
#: round-robin grey, the paper's reference numbers grey; names that share a figure never share a colour.
PALETTE: dict[str, str] = {
    # request routers (ELDR, BalanceRoute, the cross-paper notebook, the live proxy)
    "round_robin": "#7f7f7f", "random": "#bcbd22", "jsq": "#1f77b4", "p2c": "#e377c2", "least_kv": "#2ca02c",
    # (vLLM's versions: the installed one in the family's orange, latest light orange, legacy gold; every name at
    # least 20 CIE76 and 20 CIEDE2000 units from every name it shares one of 05's figures with: tests/test_palette.py)
    "vllm_dp": "#ff7f0e", "vllm_dp@0.32": "#ff7f0e", "vllm_dp@latest": "#fdae6b", "vllm_dp@legacy": "#e7ba52",
    "sglang_round_robin": "#98df8a", "sglang_minimum_tokens": "#c6dbef", "sglang_total_tokens": "#000000",
    "eldr": "#d62728", "domain_oracle": "#000000",
    "br0": "#d62728", "brh": "#9467bd", "brh_oracle": "#9467bd", "brh_tuned": "#e7cb94", "brh_tuned_oracle": "#e7cb94",
    "brh_survival": "#bcbd22", "brh_exact_match": "#e377c2", "brh_learned": "#17becf",
    # speculative decoding (Hierarchy Drafting, DSD): methods, draft stores, modes
    "ar": "#7f7f7f", "early_exit": "#1f77b4", "pld": "#9467bd", "ngram": "#17becf", "suffix": "#bcbd22", "rest": "#ff7f0e",
    "hd": "#d62728", "hd-cost": "#d62728", "hd(wsl)": "#d62728", "hd(lsw)": "#000000", "hd(swl)": "#17becf", "hd-fixed": "#ff9896",
    "w": "#2ca02c", "s": "#1f77b4", "l": "#ff7f0e", "p": "#9467bd", "bonus": "#d9d9d9",
    "w-only": "#2ca02c", "s-only": "#1f77b4", "l-only": "#ff7f0e",
    "colocated": "#1f77b4", "dsd_sync": "#ff7f0e", "dsd_pipelined": "#2ca02c",
    # AFD sizing
    "theory": "#1f77b4", "simulation": "#d62728", "attention": "#2ca02c", "ffn": "#9467bd",
    # references and model shapes
    "paper": "#7f7f7f", "moelab": "#d62728",
    "qwen3-30b-a3b": "#1f77b4", "olmoe-1b-7b": "#ff7f0e", "mixtral-8x7b": "#2ca02c", "qwen1.5-moe-a2.7b": "#d62728",
    "deepseek-v2-lite": "#9467bd", "gpt-oss-120b": "#8c564b", "gemma-4-26b-a4b": "#e377c2", "deepseek-v3": "#17becf",
    "llama-3.1-70b": "#7f7f7f", "tiny-moe": "#bcbd22", "sharegpt-moe": "#aec7e8", "llama2-7b": "#ffbb78",
    "tinyllama-1.1b": "#98df8a", "llama-160m": "#c5b0d5",
}
# Other spellings of the same name.
ALIASES = {"rr": "round_robin", "l (rest)": "l", "rest/l": "l", "vllm_dp@0.32.0": "vllm_dp@0.32",
           "hd(w,s,l)": "hd(wsl)", "sim": "simulation", "co-located": "colocated",
           # the names notebook 02 shows its methods under (each its method's colour, never a hashed one)
           "hd (cost-aware)": "hd-cost", "hd (paper, fixed)": "hd-fixed", "vllm ngram (prompt lookup)": "ngram",
           "vllm suffix decoding": "suffix", "ar (no drafting)": "ar"}
# Unknown names get one of these, chosen by a hash of the name (the same in every process).
FALLBACK_COLORS = ("#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#31a354", "#756bb1", "#636363",
                   "#6baed6", "#fd8d3c", "#74c476", "#9e9ac8", "#969696", "#ad494a", "#5254a3", "#b5cf6b")


def color_for(name: str) -> str:
    """The lab's colour for a router, method, store, mode or model ``name``.

    Lookup is case-insensitive and tolerates the spellings in :data:`ALIASES`; a versioned name
    (``vllm_dp@0.33``) without its own entry takes its base name's colour. Any other name gets a
    colour from :data:`FALLBACK_COLORS` picked by a stable hash of the name, so it is the same in every
    figure and every run."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string; got {name!r}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in PALETTE:
        return PALETTE[key]
    base = key.split("@", 1)[0]
    if base in PALETTE:
        return PALETTE[base]
    digest = hashlib.sha1(key.encode()).digest()
    return FALLBACK_COLORS[digest[0] % len(FALLBACK_COLORS)]


def distinct_colors(names: list[str], min_delta_e: float = 20.0) -> dict[str, str]:
    """A colour per name for one figure: :func:`color_for`'s, except that a name whose colour is closer than
    ``min_delta_e`` (CIE76), or than the figure-hygiene check's CIEDE2000 bound, to one already given in this figure
    takes the next :data:`FALLBACK_COLORS` entry far enough from all of them (names are served in order, so the
    first keeps its own colour)."""
    def clashes(color: str) -> bool:
        return any(colors_too_close(color, other, min_delta_e=min_delta_e) is not None for other in given.values())

    given: dict[str, str] = {}
    for name in names:
        color = color_for(name)
        if clashes(color):
            color = next((c for c in FALLBACK_COLORS if not clashes(c)), color)
        given[name] = color
    return given


def untitled_axes(fig: Any) -> list[str]:
    """The cartesian axes of ``fig`` that a reader cannot name: they carry a trace but have no title.

    An axis counts when a trace that is not ``visible=False`` is drawn on it (tables, pies, indicators,
    Sankey diagrams and polar/geo traces have no cartesian axes). It is not reported when it is hidden
    (``visible=False``) or shows no tick labels, or when an axis it shares carries the title: the titled
    axis it ``matches``, or a titled axis of its ``matches`` group in the same subplot column (x axes) or
    row (y axes), as in a ``make_subplots`` grid with shared axes. Layout annotations (subplot titles)
    are not axis titles: the lab does not use them as such.

    A colour bar is an axis too: a trace that shows one (a heatmap or contour unless ``showscale=False``, a
    marker with ``showscale=True``) without a colour-bar title is reported as ``"colorbar<i>"``, ``i`` the
    trace's index.

    Parameters
    ----------
    fig : plotly.graph_objects.Figure or FigureWidget
        The figure to check.

    Returns
    -------
    list of str
        Layout names of the untitled axes (``"xaxis"``, ``"yaxis2"``, ...), sorted, then the untitled colour
        bars; empty when every plotted axis has a title.
    """
    layout = fig.layout.to_plotly_json()
    axes = {k: v for k, v in layout.items() if re.fullmatch(r"[xy]axis\d*", k)}
    used = {axis + (getattr(trace, axis) or axis[0])[1:] for trace in fig.data
            if trace.visible is not False and hasattr(trace, "xaxis") for axis in ("xaxis", "yaxis")}

    def titled(name: str) -> bool:
        return bool(str((axes.get(name, {}).get("title") or {}).get("text") or "").strip())

    def group(name: str) -> str:  # the last axis of its ``matches`` chain (a reference "x2" names "xaxis2")
        chain = [name]
        while (ref := axes.get(chain[-1], {}).get("matches")) and ref[0] + "axis" + ref[1:] not in chain:
            chain.append(ref[0] + "axis" + ref[1:])
        return chain[-1]

    def shares_title(name: str) -> bool:
        axis = axes.get(name, {})
        return any(other[0] == name[0] and other != name and titled(other) and group(other) == group(name)
                   and (axis.get("matches") == other[0] + other[5:]
                        or list(axes[other].get("domain", [0, 1])) == list(axis.get("domain", [0, 1])))
                   for other in axes)

    untitled = [name for name in sorted(used)
                if not titled(name) and axes.get(name, {}).get("visible") is not False
                and axes.get(name, {}).get("showticklabels") is not False and not shares_title(name)]
    return untitled + [f"colorbar{i}" for i, trace in enumerate(fig.data) if _untitled_colorbar(trace)]


_SCALE_TRACES = ("heatmap", "contour", "histogram2d", "histogram2dcontour", "surface", "densitymapbox")


def _untitled_colorbar(trace: Any) -> bool:
    """``trace`` shows a colour bar whose title is empty."""
    if trace.visible is False:
        return False
    t = trace.to_plotly_json()
    if t.get("type") in _SCALE_TRACES and t.get("showscale", True) and t.get("coloraxis") is None:
        bar = t.get("colorbar") or {}
    elif (t.get("marker") or {}).get("showscale"):
        bar = t["marker"].get("colorbar") or {}
    else:
        return False
    title = bar.get("title")
    text = title.get("text") if isinstance(title, dict) else title
    return not str(text or "").strip()


def readable(df: pd.DataFrame, digits: int = 4) -> pd.DataFrame:
    """A copy of ``df`` rounded for reading: every float to ``digits`` significant digits, never dropping a digit
    left of the decimal point (37571.27 becomes 37571, 14.9321 becomes 14.93, 0.0212 stays 0.0212), each value on
    its own scale, so a row of milliseconds beside a row of seconds keeps its digits; a float column whose values
    are then all whole numbers becomes an integer column (4096.0 shows as 4096). A missing value (NaN, None,
    pandas' NA) shows as an em dash, "—", and its column then holds objects.

    Parameters
    ----------
    df : pandas.DataFrame
        The table as computed (it is not changed).
    digits : int
        Significant digits kept of each value (>= 1).

    Returns
    -------
    pandas.DataFrame
    """
    if type(digits) is not int or digits < 1:
        raise ValueError(f"digits must be an integer >= 1; got {digits!r}")
    out = df.copy()
    for col in out.columns:
        if not pd.api.types.is_float_dtype(out[col]):
            continue
        values = out[col].to_numpy(dtype=float)
        ok = np.isfinite(values) & (values != 0)
        magnitude = np.zeros_like(values)
        magnitude[ok] = np.floor(np.log10(np.abs(values[ok])))
        decimals = np.clip(digits - 1 - magnitude, 0, 15)
        scale = 10.0 ** decimals
        rounded = np.where(np.isfinite(values), np.round(values * scale) / scale, values)
        present = rounded[~np.isnan(rounded)]
        whole = present.size > 0 and np.isfinite(present).all() and (present == np.round(present)).all()
        out[col] = pd.array(rounded, dtype="Float64").astype("Int64") if whole else rounded
    # a missing value reads as a dash, in any column: the book showed NaN, <NA> and None as if they were values
    for col in out.columns:
        missing = out[col].isna().to_numpy(dtype=bool)
        if missing.any():
            out[col] = out[col].astype(object).where(~missing, _MISSING)
    return out


_MISSING = "—"  # how readable() shows a missing value


FIGURES_ENV = "MOELAB_FIGURES"
FIGURE_META_KEY = "moelab_figure"  # layout.meta key save_figure stamps with the file name (tests find shown figures)
PNG_ENV = "MOELAB_PNG"  # "0": HTML only (fast, for CI); "1": PNG required; unset: PNG when a Chromium exists


def figures_dir(out_dir: str | os.PathLike | None = None) -> Path:
    """Where figures go: ``out_dir``, else ``$MOELAB_FIGURES``, else ``figures/`` at the repo root."""
    if out_dir is None:
        out_dir = os.environ.get(FIGURES_ENV)
    if out_dir is None:
        out_dir = repo_root() / "figures"
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _quiet_export_logs() -> None:
    """Silence choreographer (kaleido's Chromium driver): it logs a traceback to stderr for a DevTools message it
    could not decode and then ignores (``JSONError decoding message. Ignoring``), while the PNG is still written."""
    logging.getLogger("choreographer").setLevel(logging.CRITICAL)


def save_figure(fig: Any, name: str, out_dir: str | os.PathLike | None = None, *, png: bool | None = None) -> dict[str, Path]:
    """Write ``fig`` as an HTML file (always) and a PNG (when kaleido finds a Chromium; ``png=True``
    or ``$MOELAB_PNG=1`` makes a failed export an error, ``$MOELAB_PNG=0`` skips it). Returns the paths.

    The figure's ``layout.meta`` gets ``{FIGURE_META_KEY: name}`` (when meta is empty or a dict), so the
    copy a notebook displays afterwards can be matched to the file exactly."""
    out = figures_dir(out_dir)
    if fig.layout.meta is None or isinstance(fig.layout.meta, dict):  # stamp the name: a shown copy carries it
        fig.update_layout(meta={**(fig.layout.meta or {}), FIGURE_META_KEY: name})
    written = {"html": atomic_write_text(out / f"{name}.html", fig.to_html(include_plotlyjs="cdn", full_html=True))}
    if png is None and os.environ.get(PNG_ENV) in ("0", "1"):
        png = os.environ[PNG_ENV] == "1"
    want_png = png if png is not None else _chromium() is not None
    if want_png:
        try:
            # lazy: plotly's export (kaleido, Chromium) loads only when a PNG is written
            import plotly.io as pio

            written["png"] = out / f"{name}.png"
            _quiet_export_logs()
            # a figure that sets its own height (a table sized to its rows) is exported at that height
            data = pio.to_image(fig, format="png", width=1000, height=int(fig.layout.height or 560), scale=1)
            atomic_write_bytes(written["png"], data)
        except Exception as exc:  # kaleido or Chromium missing/broken
            written.pop("png", None)
            if png:
                raise RuntimeError(f"PNG export failed ({exc}); install kaleido and Debian's chromium") from exc
    return written


def write_results(name: str, results: dict[str, Any], out_dir: str | os.PathLike | None = None) -> Path:
    """Record a notebook's key numbers as ``<name>.json`` next to its figures (tests read it)."""
    return atomic_write_json(figures_dir(out_dir) / f"{name}.json", results)


def _same_json(a: Any, b: Any) -> bool:
    """Whether two plotly JSON values are equal (numpy arrays inside compared element by element)."""
    try:
        return bool(a == b)
    except ValueError:  # an array inside: `==` is element-wise and has no single truth value
        # lazy: plotly's JSON encoder is only needed for the rare layout value holding an array
        from plotly.utils import PlotlyJSONEncoder

        return json.dumps(a, cls=PlotlyJSONEncoder, sort_keys=True) == json.dumps(b, cls=PlotlyJSONEncoder,
                                                                                   sort_keys=True)


def refresh(widget: Any, fig: Any) -> None:
    """Make a ``FigureWidget`` show a freshly built figure in one redraw: traces updated in place when
    the trace list has the same length (so legends and widget state stay), replaced otherwise; layout
    merged (titles, shapes, annotations, axes).

    Only the top-level layout entries that differ from what the widget shows are sent: re-validating an
    unchanged entry is pure cost, and re-validating the template (the same on every redraw) was most of a
    slider's response time in notebook 03's panel."""
    current = widget.layout.to_plotly_json()
    changed = {k: v for k, v in fig.layout.to_plotly_json().items() if not _same_json(current.get(k), v)}
    with widget.batch_update():
        if len(widget.data) == len(fig.data):
            for old, new in zip(widget.data, fig.data):
                old.update({k: v for k, v in new.to_plotly_json().items() if k != "type"})
        else:
            widget.data = []
            widget.add_traces(list(fig.data))
        if changed:
            widget.layout.update(changed)
    sync_widget_state(widget)


def sync_widget_state(widget: Any) -> None:
    """Make a ``FigureWidget``'s kernel-side state (``_widget_data``/``_widget_layout``) the figure it
    shows now, without messaging the views that already draw it.

    Plotly sends later edits to the browser as one-off messages and keeps the state a new view starts
    from at the figure the widget was created with; a view created later (Voila, which connects after
    the notebook ran; a reopened page; a second ``display``) would draw that stale first figure. The
    trait values are written directly: assigning them would also push a full-state change to the live
    views on top of the edit messages already sent, and plotly's front end then redraws twice from two
    sources (seen as empty figures in JupyterLab)."""
    if hasattr(widget, "_widget_data") and hasattr(widget, "_layout_obj"):
        widget._trait_values["_widget_data"] = deepcopy(widget._data)
        widget._trait_values["_widget_layout"] = deepcopy(widget._layout_obj._props)


def _figure_widgets(obj: Any) -> list[Any]:
    """The plotly FigureWidgets in an ipywidgets tree (depth first)."""
    if hasattr(obj, "_widget_data") and hasattr(obj, "to_image"):
        return [obj]
    out = []
    for child in getattr(obj, "children", ()) or ():
        out.extend(_figure_widgets(child))
    return out


def static_fallback_html(obj: Any) -> str | None:
    """The static stand-in shown where widgets cannot render (GitHub, nbviewer, an exported notebook):
    PNG images of the panel's figures when PNG export is on (``$MOELAB_PNG`` / a Chromium for kaleido,
    as :func:`save_figure`), else a short note. JupyterLab and Voila prefer the live widget."""
    figs = _figure_widgets(obj)
    if not figs:
        return None
    png = os.environ.get(PNG_ENV)
    want_png = png == "1" if png in ("0", "1") else _chromium() is not None
    if want_png:
        # lazy: plotly's export (kaleido, Chromium) loads only when a PNG stand-in is drawn
        import plotly.io as pio

        _quiet_export_logs()
        try:
            imgs = [base64.b64encode(pio.to_image(f, format="png", width=900, height=480)).decode() for f in figs]
        except Exception:  # kaleido or Chromium missing/broken: fall back to the note
            imgs = []
        if imgs:
            return "".join(f'<img alt="static copy of an interactive figure" src="data:image/png;base64,{b}"/>'
                           for b in imgs)
    return (f"<p><i>Interactive panel with {len(figs)} figure(s): open this notebook in JupyterLab or "
            f"<code>moelab app</code> to use it (static copies: set MOELAB_PNG=1).</i></p>")


def install_notebook_hooks(ip: Any = None) -> bool:
    """In an IPython kernel: give every widget panel holding a figure a static HTML/PNG fallback
    (:func:`static_fallback_html`) beside its live widget view.
    Called when ``moelab.viz`` is imported; returns False outside IPython or with ``$MOELAB_VIZ_HOOKS=0``.
    Idempotent."""
    if os.environ.get("MOELAB_VIZ_HOOKS") == "0":  # opt out (plain IPython display behaviour)
        return False
    if ip is None:
        try:
            # lazy: IPython is optional (no moelab dependency); without it there is no kernel to hook
            from IPython import get_ipython
        except ImportError:
            return False
        ip = get_ipython()
    if ip is None or getattr(ip, "_moelab_viz_hooks", False):
        return ip is not None
    html = ip.display_formatter.formatters["text/html"]
    for cls in ("ipywidgets.widgets.widget_box.Box", "plotly.basewidget.BaseFigureWidget"):
        module, _, name = cls.rpartition(".")
        html.for_type_by_name(module, name, static_fallback_html)
    ip._moelab_viz_hooks = True
    return True


def slider(description: str, value: float, low: float, high: float, step: float, *, integer: bool = False, **kw: Any):
    """An ipywidgets slider with a readable label width."""
    cls = w.IntSlider if integer else w.FloatSlider
    return cls(value=value, min=low, max=high, step=step, description=description, continuous_update=False,
               style={"description_width": "initial"}, layout=w.Layout(width="420px"), **kw)


install_notebook_hooks()
