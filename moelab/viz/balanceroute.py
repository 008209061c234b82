"""Figures and the interactive panel for notebook 05 (BalanceRoute)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from moelab.viz.common import PALETTE, refresh, slider

_BRH_COLORS = {"brh_oracle": "#9467bd", "brh_survival": "#8c564b", "brh_exact_match": "#e377c2",
               "brh_learned": "#000000"}


def _color(router: str) -> str:
    return _BRH_COLORS.get(router) or PALETTE.get(router, PALETTE.get(router.split("_")[0], "#444444"))


def imbalance_over_time(results: dict[str, Any], G: int, *, smooth: int = 25, max_points: int = 1500) -> go.Figure:
    """Per-step imbalance ``G*max - sum`` (moving average over ``smooth`` steps) per router."""
    fig = go.Figure()
    for name, res in results.items():
        st = res.steps
        imb = st["imbalance"].to_numpy(np.float64)  # recorded by the simulator per step
        if smooth > 1 and imb.size >= smooth:
            imb = np.convolve(imb, np.ones(smooth) / smooth, mode="valid")
        t = st["time_s"].to_numpy()[-imb.size:] if imb.size else st["time_s"].to_numpy()
        stride = max(1, imb.size // max_points)
        fig.add_trace(go.Scatter(x=t[::stride], y=imb[::stride], mode="lines", name=name,
                                 line={"color": _color(name), "width": 2 if name.startswith("br") else 1}))
    fig.update_layout(title=f"Imbalance over time (G={G}; moving average of {smooth} steps)",
                      xaxis_title="simulated time (s)", yaxis_title="G*max - sum of worker KV loads (tokens)",
                      template="plotly_white")
    return fig


def bars(df: pd.DataFrame, metric: str, title: str, yaxis: str) -> go.Figure:
    """Grouped bars of ``metric`` per router, one group per G."""
    fig = go.Figure()
    for router, g in df.groupby("router", sort=False):
        fig.add_trace(go.Bar(x=[f"G={v}" for v in g["G"]], y=g[metric], name=router, marker_color=_color(router)))
    fig.update_layout(barmode="group", title=title, yaxis_title=yaxis, template="plotly_white")
    return fig


def decision_times(results: dict[str, Any]) -> go.Figure:
    """Distribution of router decision time per routing step (box plots, log scale)."""
    fig = go.Figure()
    for name, res in results.items():
        d = res.steps["decision_ms"].to_numpy()
        d = d[np.isfinite(d)]
        fig.add_trace(go.Box(y=np.maximum(d, 1e-4), name=name, marker_color=_color(name), boxpoints=False))
    fig.update_layout(title="Router decision time per routing step", yaxis_type="log", yaxis_title="ms",
                      template="plotly_white", showlegend=False)
    return fig


def table(df: pd.DataFrame, title: str) -> go.Figure:
    """A plotly table of a small DataFrame (numbers rounded)."""
    shown = df.copy()
    for c in shown.columns:
        if pd.api.types.is_float_dtype(shown[c]):
            shown[c] = shown[c].map(lambda v: "—" if pd.isna(v) else (f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.2f}"))
    widths = [3] + [2] * (len(shown.columns) - 1)
    fig = go.Figure(go.Table(columnwidth=widths, header={"values": list(shown.columns), "align": "left"},
                             cells={"values": [shown[c] for c in shown.columns], "align": "left", "height": 24}))
    fig.update_layout(title=title, template="plotly_white", margin={"l": 20, "r": 20, "t": 50, "b": 10})
    return fig


def interactive_panel(run_fn: Any, *, G: int, slots: int, horizon: int, gamma: float, beta: float | None,
                      rate_scale: float):
    """Sliders (G, slots, H, discount, beta, rate scale) wired to a FigureWidget of imbalance over time.

    ``run_fn(G, slots, horizon, gamma, beta, rate_scale) -> dict[name, SimResult]`` runs the small
    simulation; every slider change reruns it and replaces the traces.
    """
    import ipywidgets as w

    fig = go.FigureWidget(imbalance_over_time(run_fn(G, slots, horizon, gamma, beta, rate_scale), G))
    s_g = slider("G (workers)", G, 2, 16, 1, integer=True)
    s_b = slider("slots per worker", slots, 4, 128, 4, integer=True)
    s_h = slider("H (lookahead)", horizon, 0, 80, 1, integer=True)
    s_d = slider("discount", gamma, 0.05, 1.0, 0.01)
    s_beta = slider("beta (0 = G)", 0.0 if beta is None else beta, 0.0, 64.0, 1.0)
    s_r = slider("rate scale (x capacity)", rate_scale, 0.5, 2.0, 0.05)

    def update(_=None) -> None:
        res = run_fn(s_g.value, s_b.value, s_h.value, s_d.value, s_beta.value or None, s_r.value)
        new = imbalance_over_time(res, s_g.value)
        refresh(fig, new)

    for s in (s_g, s_b, s_h, s_d, s_beta, s_r):
        s.observe(update, names="value")
    return w.VBox([w.HBox([w.VBox([s_g, s_b, s_r]), w.VBox([s_h, s_d, s_beta])]), fig])
