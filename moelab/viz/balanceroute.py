"""Figures and the interactive panel for notebook 05 (BalanceRoute)."""

from __future__ import annotations

import math
import textwrap
from typing import Any

import ipywidgets as w
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from moelab.viz.common import color_for, refresh, slider
from moelab.viz.hygiene import BOOK_WIDTH_PX, TABLE_CELL_PAD_PX, TABLE_EM_PER_CHAR

# one colour per method: the lab's palette (moelab.viz.common.color_for)
_SHAPE_SYMBOLS = {"qwen3-30b-a3b": "circle", "deepseek-v3": "diamond", "llama-3.1-70b": "square"}


def _color(router: str) -> str:
    return color_for(router)


def _dash(router: str) -> str:
    """A line style per router family, so that vLLM's versions (a family of oranges beside BR-0's red) and
    SGLang's policies are told apart by more than a shade."""
    return "dot" if router.startswith("vllm") else "dash" if router.startswith("sglang") else "solid"


def imbalance_over_time(results: dict[str, Any], G: int, *, smooth: int = 25, max_points: int = 1500) -> go.Figure:
    """Per-step imbalance ``G*max - sum`` (moving average over ``smooth`` steps) per router."""
    fig = go.Figure()
    for name, res in results.items():
        st = res.steps
        imb = st["imbalance"].to_numpy(np.float64)  # recorded by the simulator per step
        if smooth > 1 and imb.size >= smooth:
            imb = np.convolve(imb, np.ones(smooth) / smooth, mode="valid")
        t = st["t_s"].to_numpy()[-imb.size:] if imb.size else st["t_s"].to_numpy()
        stride = max(1, imb.size // max_points)
        fig.add_trace(go.Scatter(x=t[::stride], y=imb[::stride], mode="lines", name=name,
                                 line={"color": _color(name), "width": 2 if name.startswith("br") else 1,
                                       "dash": _dash(name)}))
    fig.update_layout(title=f"Imbalance over time (G={G}; moving average of {smooth} steps)",
                      xaxis_title="simulated time (s)", yaxis_title="imbalance I = G·M − Σ L<sub>g</sub> (KV tokens)",
                      template="plotly_white")
    return fig


def bars(df: pd.DataFrame, metric: str, title: str, yaxis: str) -> go.Figure:
    """Grouped bars of ``metric`` per router, one group per G."""
    fig = go.Figure()
    for router, g in df.groupby("router", sort=False):
        fig.add_trace(go.Bar(x=[f"G={v}" for v in g["G"]], y=g[metric], name=router, marker_color=_color(router)))
    fig.update_layout(barmode="group", title=title, xaxis_title="G (DP decode ranks)", yaxis_title=yaxis,
                      template="plotly_white")
    return fig


def relative_bars(rel: pd.DataFrame, title: str, yaxis: str) -> go.Figure:
    """Grouped bars of each router's ``vs_best_baseline_pct`` per G, each bar labelled with its value.

    Parameters
    ----------
    rel : pandas.DataFrame
        :func:`moelab.balanceroute.experiments.relative_to_best_baseline`'s frame (``G``, ``router``,
        ``vs_best_baseline_pct``, ``best_baseline``): the differences between routers are drawn from 0, the best
        baseline of each G (its bar is labelled "best").
    title, yaxis : str
        The figure's title and the y-axis title.
    """
    fig = go.Figure()
    for router, g in rel.groupby("router", sort=False):
        y = g["vs_best_baseline_pct"].astype(float)
        fig.add_trace(go.Bar(x=[f"G={v}" for v in g["G"]], y=y, name=router, marker_color=_color(router),
                             text=["best" if best else f"{v:+.1f}%" for v, best in zip(y, g["router"] == g["best_baseline"])],
                             textposition="outside", cliponaxis=False))
    fig.add_hline(y=0, line_color="#555")
    # room for the labels outside the longest bars, and labels never hidden: with mode "hide" plotly dropped the
    # label of the largest loss (-12.5%) at the book's 688-px column, where it had no room below its bar
    values = rel["vs_best_baseline_pct"].astype(float).to_numpy()
    low, high = min(0.0, float(np.nanmin(values))), max(0.0, float(np.nanmax(values)))
    pad = 0.18 * (high - low or 1.0)
    fig.update_layout(barmode="group", title=title, xaxis_title="G (DP decode ranks)", yaxis_title=yaxis,
                      template="plotly_white", uniformtext={"minsize": 8, "mode": "show"},
                      yaxis_range=[low - (pad if low < 0 else 0), high + pad])
    return fig


def decision_times(results: dict[str, Any], G: int | None = None) -> go.Figure:
    """Distribution of router dispatch time, one call of the router per step (box plots, log scale).

    Parameters
    ----------
    results : dict
        Router name to its simulation result (``steps["decision_ms"]`` is read).
    G : int, optional
        The DP ranks the runs used, named in the title (a decision's time grows with the ranks it scores).
    """
    fig = go.Figure()
    for name, res in results.items():
        d = res.steps["decision_ms"].to_numpy()
        d = d[np.isfinite(d)]
        fig.add_trace(go.Box(y=np.maximum(d, 1e-4), name=name, marker_color=_color(name), boxpoints=False))
    fig.update_yaxes(type="log", dtick=1)  # one label per decade: no stray 2s and 5s between them
    fig.update_layout(title="Router dispatch time (one call of the router)" + ("" if G is None else f" (G={G})"),
                      xaxis_title="router",
                      yaxis_title="dispatch time (ms)",
                      template="plotly_white", showlegend=False)
    return fig


#: a table column's width in characters, at least and at most (a long note column wraps instead of squeezing the
#: numbers out of sight)
TABLE_COLUMN_CHARS = (8, 30)
#: the table's font, named so that the width estimates hold in every browser (plotly's default falls back to the
#: wider Verdana where Open Sans is missing)
TABLE_FONT = {"family": "Arial, 'Liberation Sans', Helvetica, sans-serif", "size": 12}
#: the mean width of one of its characters in px: the figure-hygiene estimate (the check that finds cut cells)
TABLE_CHAR_PX = TABLE_EM_PER_CHAR * TABLE_FONT["size"]
_TABLE_MARGIN = {"l": 20, "r": 20, "t": 50, "b": 10}


def _column_px(shown: pd.DataFrame) -> tuple[list[float], float]:
    """Each column's width in px and the figure's width (px).

    A column never gets less than its longest word (plotly wraps cells and headers only at spaces, so a word
    wider than its column is cut at the edge); the width left over goes to the columns whose longest line is
    longer than their longest word, in proportion to the difference. Where the words alone are wider than the
    book's content column the figure is made as wide as they need (the page scrolls sideways), not cut."""
    low, high = TABLE_COLUMN_CHARS
    chars = lambda n: n * TABLE_CHAR_PX + TABLE_CELL_PAD_PX  # noqa: E731
    words, lines = [], []
    for c in shown.columns:
        texts = [str(v) for v in shown[c]] + [str(c).replace("_", " ")]
        words.append(chars(max(len(word) for t in texts for word in (t.split() or [""]))))
        lines.append(chars(min(max([len(str(v)) for v in shown[c]] + [low]), high)))
    need = np.array(words)
    want = np.maximum(np.array(lines), need)
    room = BOOK_WIDTH_PX - _TABLE_MARGIN["l"] - _TABLE_MARGIN["r"]
    if want.sum() <= room:
        px = want * room / want.sum()
    elif need.sum() <= room:
        px = need + (room - need.sum()) * (want - need) / (want - need).sum()
    else:
        px = need
    return px.tolist(), max(BOOK_WIDTH_PX, float(px.sum()) + _TABLE_MARGIN["l"] + _TABLE_MARGIN["r"])


def table(df: pd.DataFrame, title: str) -> go.Figure:
    """A plotly table of a small DataFrame (numbers rounded), laid out for the book's content column.

    Every column is at least as wide as its longest word (:func:`_column_px`), headers wrap at spaces to their
    column ("_" reads as a space), and the figure is as tall as every row once long cells wrap (plotly's default
    height hid the last rows behind a scroll bar)."""
    shown = df.copy()
    for c in shown.columns:
        if pd.api.types.is_float_dtype(shown[c]):
            shown[c] = shown[c].map(lambda v: "—" if pd.isna(v) else (f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.2f}"))
    px, width = _column_px(shown)
    fits = [max(1, int((p - TABLE_CELL_PAD_PX) / TABLE_CHAR_PX)) for p in px]  # characters per line
    header = ["<br>".join(textwrap.wrap(str(c).replace("_", " "), n, break_long_words=False)) or str(c)
              for c, n in zip(shown.columns, fits)]
    lines = [max(math.ceil(len(str(v)) / n) for v, n in zip(row, fits)) for row in shown.itertuples(index=False)]
    header_lines = max(h.count("<br>") + 1 for h in header)
    fig = go.Figure(go.Table(columnwidth=px, header={"values": header, "align": "left", "font": TABLE_FONT},
                             cells={"values": [shown[c] for c in shown.columns], "align": "left", "height": 24,
                                    "font": TABLE_FONT}))
    fig.update_layout(title=title, template="plotly_white", margin=_TABLE_MARGIN,
                      height=60 + 20 * header_lines + 10 + sum(24 + 16 * (n - 1) for n in lines) + 30)
    if width > BOOK_WIDTH_PX:
        fig.update_layout(width=width)
    return fig


def interactive_panel(run_fn: Any, *, G: int, slots: int, horizon: int, gamma: float, beta: float | None,
                      load: float):
    """Sliders (G, slots, H, discount, beta, offered load) wired to a FigureWidget of imbalance over time.

    ``run_fn(G, slots, horizon, gamma, beta, load) -> dict[name, SimResult]`` runs the small
    simulation; every slider change reruns it and replaces the traces.
    """
    fig = go.FigureWidget(imbalance_over_time(run_fn(G, slots, horizon, gamma, beta, load), G))
    s_g = slider("G (ranks)", G, 2, 16, 1, integer=True)
    s_b = slider("slots per rank", slots, 4, 128, 4, integer=True)
    s_h = slider("H (lookahead)", horizon, 0, 80, 1, integer=True)
    s_d = slider("δ (discount per step)", gamma, 0.05, 1.0, 0.01)
    s_beta = slider("beta (0 = G)", 0.0 if beta is None else beta, 0.0, 64.0, 1.0)
    s_r = slider("offered load (x capacity)", load, 0.6, 1.4, 0.05)

    def update(_=None) -> None:
        res = run_fn(s_g.value, s_b.value, s_h.value, s_d.value, s_beta.value or None, s_r.value)
        refresh(fig, imbalance_over_time(res, s_g.value))

    for s in (s_g, s_b, s_h, s_d, s_beta, s_r):
        s.observe(update, names="value")
    return w.VBox([w.HBox([w.VBox([s_g, s_b, s_r]), w.VBox([s_h, s_d, s_beta])]), fig])


def load_sweep(df: pd.DataFrame, metric: str, title: str, yaxis: str) -> go.Figure:
    """``metric`` vs offered load (x capacity), one line per router."""
    fig = go.Figure()
    for router, g in df.groupby("router", sort=False):
        g = g.sort_values("load")
        fig.add_trace(go.Scatter(x=g["load"], y=g[metric], mode="lines+markers", name=router,
                                 line={"color": _color(router), "width": 3 if router.startswith("br") else 1.5}))
    fig.update_layout(title=title, xaxis_title="offered load (x capacity)", yaxis_title=yaxis, template="plotly_white")
    return fig


_REGIME_METRICS = {"brh_throughput_gain_pct": "BR-H (paper constants) throughput gain %",
                   "br0_throughput_gain_pct": "BR-0 throughput gain %",
                   "brh_imbalance_reduction_pct": "BR-H imbalance reduction %",
                   "br0_imbalance_reduction_pct": "BR-0 imbalance reduction %"}


def regime_heatmap(grid: pd.DataFrame, G: int, slots: int, metric: str = "brh_throughput_gain_pct") -> go.Figure:
    """Heatmap of ``metric`` over model shape x context scale at one (G, slots); each cell also shows
    the step's attention share."""
    if metric not in _REGIME_METRICS:
        raise ValueError(f"metric must be one of {sorted(_REGIME_METRICS)}; got {metric!r}")
    sub = grid[(grid["G"] == G) & (grid["slots"] == slots)]
    if sub.empty:
        raise ValueError(f"the regime grid has no setting with G={G}, slots={slots}")
    z = sub.pivot_table(index="shape", columns="context_scale", values=metric)
    share = sub.pivot_table(index="shape", columns="context_scale", values="attention_share").reindex_like(z)
    text = [[f"{v:+.1f}%<br>attn {a:.0%}" for v, a in zip(zr, ar)] for zr, ar in zip(z.to_numpy(), share.to_numpy())]
    lim = float(np.nanmax(np.abs(z.to_numpy()))) or 1.0
    quantity = "throughput gain" if "throughput" in metric else "imbalance reduction"
    fig = go.Figure(go.Heatmap(z=z.to_numpy(), x=[f"x{c:g}" for c in z.columns], y=list(z.index), text=text,
                               texttemplate="%{text}", colorscale="RdBu", zmid=0, zmin=-lim, zmax=lim,
                               colorbar={"title": {"text": f"{quantity} (%)"}}))
    fig.update_layout(title=f"{_REGIME_METRICS[metric]} vs the best baseline<br><sup>G={G}, {slots} slots</sup>",
                      xaxis_title="context scale (each prompt this many times longer)", yaxis_title="model shape", template="plotly_white")
    return fig


def gain_vs_share(grid: pd.DataFrame, paper_gain_pct: float | None = None,
                  highlight: dict[str, Any] | None = None) -> go.Figure:
    """Throughput gain of BR-0 and BR-H against the attention share of the step, every grid setting.

    One panel per DP degree ``G`` (shared y axis), so settings that differ only in ``G`` do not pile on each
    other; the colour is the router, the symbol the model shape, and a thin grey line joins the two routers
    of one setting. ``paper_gain_pct`` (the paper's G=8 gain) is a dashed line where it lies within reach of
    the grid's gains (at most 1.25 x the largest), otherwise it is named in its panel's title, so it does not
    stretch the axis and squeeze the data. ``highlight`` (a setting: shape, context_scale,
    slots, G) is marked with a star, e.g. the H200 Qwen3 point."""
    g_values = sorted(int(g) for g in set(grid["G"]))
    routers = (("br0_throughput_gain_pct", "BR-0", color_for("br0")),
               ("brh_throughput_gain_pct", "BR-H (paper constants)", color_for("brh_oracle")))
    paper_col = (g_values.index(8) + 1 if 8 in g_values else len(g_values)) if paper_gain_pct is not None else None
    top = float(np.nanmax(grid[[c for c, _, _ in routers]].to_numpy()))
    paper_on_axis = paper_gain_pct is not None and paper_gain_pct <= 1.25 * max(top, 0.0)
    titles = [f"G = {g}" for g in g_values]
    if paper_col is not None and not paper_on_axis:  # far above the data: named in its panel's title, off the axis
        titles[paper_col - 1] += f"<br>paper's BR-H: +{paper_gain_pct:g}%, above the axis"
    fig = make_subplots(rows=1, cols=len(g_values), shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=titles)
    for col, g in enumerate(g_values, start=1):
        sub = grid[grid["G"] == g]
        # the two routers of one setting, joined (None breaks the line between settings)
        xs, ys = [], []
        for r in sub.itertuples():
            xs += [r.attention_share, r.attention_share, None]
            ys += [r.br0_throughput_gain_pct, r.brh_throughput_gain_pct, None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": "#c8c8c8", "width": 1}, showlegend=False,
                                 hoverinfo="skip"), row=1, col=col)
        for column, name, color in routers:
            fig.add_trace(go.Scatter(
                x=sub["attention_share"], y=sub[column], mode="markers", name=name, legendgroup=name,
                showlegend=col == 1,
                marker={"color": color, "size": 11, "line": {"color": "white", "width": 1},
                        "symbol": [_SHAPE_SYMBOLS.get(s, "circle") for s in sub["shape"]]},
                text=[f"{r.shape}, x{r.context_scale:g}, {r.slots} slots, G={r.G}" for r in sub.itertuples()],
                hovertemplate="%{text}<br>attention %{x:.0%}<br>gain %{y:+.2f}%<extra></extra>"), row=1, col=col)
    if highlight is not None:
        m = np.ones(len(grid), bool)
        for k, v in highlight.items():
            m &= (grid[k] == v).to_numpy()
        if m.any():
            r = grid[m].iloc[0]
            fig.add_trace(go.Scatter(x=[r["attention_share"]], y=[r["brh_throughput_gain_pct"]], mode="markers+text",
                                     marker={"symbol": "star", "size": 16, "color": "#ffd700",
                                             "line": {"color": "black", "width": 1}},
                                     text=[f"{r['shape']} x{r['context_scale']:g}, {int(r['slots'])} slots"],
                                     textposition="top center", name="H200 Qwen3 point"),
                          row=1, col=g_values.index(int(r["G"])) + 1)
    # the key to the symbols, in the legend (a static page shows no hover text): one entry per shape
    for shape in dict.fromkeys(grid["shape"]):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"symbol: {shape}", legendgroup="marker key",
                                 marker={"color": "#7f7f7f", "size": 10, "symbol": _SHAPE_SYMBOLS.get(shape, "circle")}),
                      row=1, col=1)
    if paper_on_axis:
        fig.add_hline(y=paper_gain_pct, line_dash="dash", annotation_text=f"paper: BR-H +{paper_gain_pct:g}% (G=8)",
                      row=1, col=paper_col)
    # a short title per panel (the figure's title says which step): the long one ran into its neighbour's at 688 px
    fig.update_xaxes(title_text="attention share", tickformat=".0%", matches="x")
    fig.update_yaxes(title_text="throughput gain vs best baseline (%)", row=1, col=1)
    fig.update_layout(title="Throughput gain vs the attention share of the step<br><sup>one panel per G; symbol: shape</sup>",
                      template="plotly_white", margin={"t": 110})
    return fig


def regime_panel(grid: pd.DataFrame, *, G: int, slots: int, metric: str = "brh_throughput_gain_pct"):
    """The regime heatmap with sliders for G and slots and a metric dropdown (no re-simulation: the
    grid is computed once)."""
    gs, ss = sorted(grid["G"].unique().tolist()), sorted(grid["slots"].unique().tolist())
    fig = go.FigureWidget(regime_heatmap(grid, G, slots, metric))
    s_g = w.SelectionSlider(options=gs, value=G, description="G (ranks)")
    s_b = w.SelectionSlider(options=ss, value=slots, description="slots")
    d_m = w.Dropdown(options=[(v, k) for k, v in _REGIME_METRICS.items()], value=metric, description="metric")

    def update(_=None) -> None:
        refresh(fig, regime_heatmap(grid, s_g.value, s_b.value, d_m.value))

    for c in (s_g, s_b, d_m):
        c.observe(update, names="value")
    return w.VBox([w.HBox([s_g, s_b, d_m]), fig])
