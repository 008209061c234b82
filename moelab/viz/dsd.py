"""Figures and the interactive panel of the DSD notebook (04_dsd_rtt)."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import NormalDist

import ipywidgets as w
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from moelab.dsd import MODES, best_mode, capacity_gain, latency_per_token, pipelined_window, rtt_breakeven
from moelab.dsd.acceptance import wilson_interval
from moelab.viz.common import color_for, refresh, slider

MODE_COLORS = {m: color_for(m) for m in ("ar", "colocated", "dsd_sync", "dsd_pipelined")}  # the lab's palette
MODE_LABELS = {"ar": "cloud AR", "colocated": "co-located SD", "dsd_sync": "DSD (sync)",
               "dsd_pipelined": "DSD (pipelined)"}


def latency_vs_rtt_figure(*, alpha: float, gamma: int, t_ar: float, t_a: float, t_d: float, t_v: float | None = None,
                          rtt_max: float = 300.0, mc: pd.DataFrame | None = None, widget: bool = False,
                          rtt_jitter: float = 0.0) -> go.Figure:
    """Latency per token of the four modes vs RTT (closed forms), with optional Monte-Carlo points
    (``mc`` columns: mode, rtt, latency, ci).

    ``rtt_jitter`` is the relative half-width of the uniform RTT jitter (see
    :func:`moelab.dsd.latency_per_token`): the curves are the closed forms averaged over it, the values
    :func:`moelab.dsd.simulate_rounds` compares its crosses with when it draws jittered round trips, so a
    cross's distance from its curve is the z it reports."""
    rtt = np.linspace(0, rtt_max, 301)
    fig = go.FigureWidget() if widget else go.Figure()
    for mode in MODES:
        y = np.broadcast_to(latency_per_token(mode, alpha=alpha, gamma=gamma, t_ar=t_ar, t_d=t_d, t_v=t_v, t_a=t_a,
                                              rtt=rtt, rtt_jitter=rtt_jitter), rtt.shape)
        fig.add_scatter(x=rtt, y=y, mode="lines", name=MODE_LABELS[mode], line={"color": MODE_COLORS[mode]},
                        legendgroup=mode)
    if mc is not None:
        for mode, g in mc.groupby("mode", sort=False):
            fig.add_scatter(x=g["rtt"], y=g["latency"], error_y={"type": "data", "array": g["ci"]}, mode="markers",
                            name=f"{MODE_LABELS[mode]} (Monte-Carlo)", marker={"color": MODE_COLORS[mode], "symbol": "x"},
                            legendgroup=mode)  # the same mode simulated: its closed form's colour
    be = float(rtt_breakeven(alpha, gamma, t_ar, t_a))
    if be >= 0:
        fig.add_vline(x=be, line_dash="dash", line_color=MODE_COLORS["dsd_sync"], annotation_text="sync break-even")
    fig.add_vline(x=float(pipelined_window(gamma, t_a)), line_dash="dot", line_color=MODE_COLORS["dsd_pipelined"],
                  annotation_text="gamma*t_a", annotation_position="bottom right")
    jitter_text = f", RTT jitter ±{rtt_jitter:.0%}" if rtt_jitter > 0 else ""
    fig.update_layout(title=f"Latency per token vs RTT (alpha={alpha:g}, gamma={gamma}, t_ar={t_ar:g} ms{jitter_text})",
                      xaxis_title="RTT (ms)", yaxis_title="ms per output token", template="plotly_white")
    return fig


def region_map_figure(*, gamma: int, t_ar: float, t_a: float, t_d: float, t_v: float | None = None,
                      rtt_max: float = 300.0, n: int = 121, widget: bool = False) -> go.Figure:
    """Which mode has the lowest latency per token over (RTT, alpha): left when the server can also
    host the draft model, right when it cannot (cloud AR vs DSD only)."""
    alpha = np.linspace(0.0, 0.98, n)
    rtt = np.linspace(0.0, rtt_max, n)
    A, R = np.meshgrid(alpha, rtt, indexing="ij")
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True,
                        subplot_titles=("server can host the draft", "server cannot (AR vs DSD)"))
    if widget:
        fig = go.FigureWidget(fig)
    colorscale = []
    for i, m in enumerate(MODES):  # discrete colours: mode index i -> its colour
        colorscale += [(i / len(MODES), MODE_COLORS[m]), ((i + 1) / len(MODES), MODE_COLORS[m])]
    for col, modes in ((1, MODES), (2, ("ar", "dsd_sync", "dsd_pipelined"))):
        idx = best_mode(alpha=A, rtt=R, gamma=gamma, t_ar=t_ar, t_a=t_a, t_d=t_d, t_v=t_v, modes=modes)
        z = np.vectorize(lambda i, ms=modes: MODES.index(ms[i]))(idx)
        names = np.vectorize(lambda i, ms=modes: MODE_LABELS[ms[i]])(idx)
        fig.add_trace(go.Heatmap(x=rtt, y=alpha, z=z, text=names, zmin=0, zmax=len(MODES), colorscale=colorscale,
                                 showscale=False, hovertemplate="RTT %{x:.0f} ms, alpha %{y:.2f}: %{text}<extra></extra>"),
                      row=1, col=col)
    for m in MODES:  # legend entries for the discrete colours
        fig.add_scatter(x=[None], y=[None], mode="markers", marker={"color": MODE_COLORS[m], "size": 12, "symbol": "square"},
                        name=MODE_LABELS[m], row=1, col=1)
    fig.update_xaxes(title_text="RTT (ms)")
    fig.update_yaxes(title_text="alpha (acceptance)", row=1, col=1)
    fig.update_layout(title=f"Fastest mode (gamma={gamma}, t_ar={t_ar:g}, t_a={t_a:g}, t_d={t_d:g} ms)",
                      template="plotly_white")
    return fig


def breakeven_table_figure(table: pd.DataFrame, *, gamma: int, t_a: float) -> go.Figure:
    """The break-even RTT table (blank where DSD never beats cloud AR)."""
    header = ["t_ar (ms)"] + [f"alpha={c}" for c in table.columns]
    cells = [table.index.tolist()] + [["" if np.isnan(v) else f"{v:.0f}" for v in table[c]] for c in table.columns]
    fig = go.Figure(go.Table(header={"values": header, "fill_color": "#dbe6f3"}, cells={"values": cells}))
    fig.update_layout(title=f"Largest RTT (ms) at which synchronous DSD beats cloud AR<br><sup>gamma={gamma}, t_a={t_a:g} ms</sup>")
    return fig


def capacity_figure(ratios: Sequence[float] = (0.05, 0.1, 0.2, 0.4), gamma_max: int = 10,
                    measured: pd.DataFrame | None = None) -> go.Figure:
    """Capacity gain ``1 + gamma*t_d/t_v`` vs gamma for several ``t_d/t_v``; ``measured`` (columns gamma,
    t_d_over_t_v, measured_ratio) adds the multi-client simulation's points."""
    gammas = np.arange(1, gamma_max + 1)
    fig = go.Figure()
    for i, c in enumerate(ratios):
        # one hue, darker for smaller t_d/t_v: every line stays readable on white (the old hue sweep ended in a
        # pale yellow) and none takes a method's colour
        color = f"hsl(220, 65%, {22 + 38 * i / max(len(ratios) - 1, 1):.0f}%)"
        fig.add_scatter(x=gammas, y=[capacity_gain(int(g), c, 1.0) for g in gammas], mode="lines",
                        name=f"theory, t_d/t_v = {c:g}", line={"color": color})
    if measured is not None:
        fig.add_scatter(x=measured["gamma"], y=measured["measured_ratio"], mode="markers", name="server simulation",
                        marker={"color": "#d62728", "size": 11, "symbol": "x"},
                        text=[f"t_d/t_v = {c:g}" for c in measured["t_d_over_t_v"]])
    fig.update_layout(title="Clients a saturated server sustains under DSD vs co-located SD<br><sup>same per-client rate</sup>",
                      xaxis_title="gamma (draft length)", yaxis_title="capacity ratio DSD / co-located",
                      template="plotly_white")
    return fig


def conditional_acceptance_figure(traces: dict, gammas: dict[str, int] | None = None, level: float = 0.95) -> go.Figure:
    """Acceptance of draft token j given the first j-1 were accepted, over each drafter's recorded rounds, with
    ``level`` Wilson intervals, and the geometric law fitted on position 1 alone (a flat dotted line: what
    i.i.d. acceptance predicts for the later positions, which the fit never saw).

    Parameters
    ----------
    traces : dict of str to AcceptanceTrace
        Recordings by key.
    gammas : dict of str to int, optional
        Draft length of each key's rounds (default: its ``gamma_max``).
    level : float
        Coverage of the error bars, in (0, 1).
    """
    z = NormalDist().inv_cdf(0.5 + float(level) / 2)
    fig = go.Figure()
    for k, (name, tr) in enumerate(traces.items()):
        g = (gammas or {}).get(name, tr.gamma_max)
        dodge = 0.08 * (k - (len(traces) - 1) / 2)  # drafters side by side, so their error bars do not overlap
        pos = tr.position_acceptance(g)
        bars = [wilson_interval(int(k), int(n), z) for k, n in zip(pos["accepted"], pos["tried"])]
        rate = np.array([b[0] for b in bars])
        lo, hi = np.array([b[1] for b in bars]), np.array([b[2] for b in bars])
        color = color_for(name)  # the lab's palette: PLD and HD as in notebook 02
        fig.add_scatter(x=pos["position"] + dodge, y=rate, mode="markers+lines",
                        name=f"{tr.drafter} (measured, gamma={g})", line={"color": color}, legendgroup=tr.drafter,
                        error_y={"type": "data", "symmetric": False, "array": hi - rate, "arrayminus": rate - lo},
                        customdata=np.column_stack([pos["position"], pos["tried"]]),
                        hovertemplate="j=%{customdata[0]}: %{y:.2f} of %{customdata[1]} tries<extra></extra>")
        fig.add_scatter(x=pos["position"], y=np.full(g, tr.first_token_rate(g)), mode="lines",
                        name=f"{tr.drafter}: geometric, fitted on position 1", line={"color": color, "dash": "dot"},
                        legendgroup=tr.drafter)  # one drafter, two readings
    fig.update_layout(title=f"Acceptance of draft token j given the first j-1 were accepted, per round"
                            f"<br><sup>{level:.0%} intervals, recorded on SmolLM2-135M</sup>",
                      xaxis_title="draft position j", yaxis_title="P(accept)", yaxis_range=[0, 1.05],
                      template="plotly_white")
    return fig


def measured_latency_figure(df: pd.DataFrame) -> go.Figure:
    """Latency per token vs mean RTT: closed form (lines) vs Monte Carlo with measured inputs (markers), and the
    residual MC / closed form - 1 (bottom). ``df`` columns: mode, rtt, closed_form, measured."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.68, 0.32], vertical_spacing=0.06)
    for mode, g in df.groupby("mode", sort=False):
        color = MODE_COLORS[mode]
        fig.add_scatter(x=g["rtt"], y=g["closed_form"], mode="lines", name=f"{MODE_LABELS[mode]} (closed form)",
                        line={"color": color}, legendgroup=mode, row=1, col=1)
        # pipelined points are open circles around sync's crosses: when every pre-drafted block is invalidated
        # (see M5) the two coincide, and neither hides the other
        marker = ({"color": color, "symbol": "circle-open", "size": 14, "line": {"width": 2}}
                  if mode == "dsd_pipelined" else {"color": color, "symbol": "x", "size": 9})
        fig.add_scatter(x=g["rtt"], y=g["measured"], mode="markers", name=f"{MODE_LABELS[mode]} (measured inputs)",
                        marker=marker, legendgroup=mode, row=1, col=1)
        fig.add_scatter(x=g["rtt"], y=100 * (g["measured"] / g["closed_form"] - 1), mode="markers+lines",
                        marker={"color": color}, showlegend=False, row=2, col=1)
    fig.add_hline(y=0, line_color="#999", row=2, col=1)
    fig.update_yaxes(title_text="ms per token", row=1, col=1)
    fig.update_yaxes(title_text="residual %", row=2, col=1)
    fig.update_xaxes(title_text="mean RTT (ms)", row=2, col=1)
    fig.update_layout(title="Latency per token: closed forms vs simulation<br><sup>with recorded acceptance and measured costs</sup>",
                      template="plotly_white", height=600)
    return fig


def dsd_panel(rtt: float = 60.0, alpha: float = 0.8, gamma: int = 5, t_a: float = 10.0, t_ar: float = 50.0,
              t_d: float = 10.0):
    """Sliders for RTT, alpha, gamma, t_a, t_ar (= t_v) and t_d wired to FigureWidgets: latency of
    every mode at this point, latency vs RTT, and the region map with the current point marked."""
    s = {
        "rtt": slider("RTT (ms)", rtt, 0, 400, 5),
        "alpha": slider("alpha (acceptance)", alpha, 0, 0.98, 0.01),
        "gamma": slider("gamma (draft length)", gamma, 1, 12, 1, integer=True),
        "t_a": slider("t_a (edge draft ms/token)", t_a, 0, 50, 1),
        "t_ar": slider("t_ar = t_v (target step, ms)", t_ar, 5, 200, 5),
        "t_d": slider("t_d (server draft ms/token)", t_d, 0, 50, 1),
    }
    text = w.HTML()
    bars = go.FigureWidget(go.Bar(x=[MODE_LABELS[m] for m in MODES], y=[0] * 4,
                                  marker_color=[MODE_COLORS[m] for m in MODES]))
    bars.update_layout(title="Latency per token at this point", xaxis_title="decoding mode", yaxis_title="ms per token",
                       template="plotly_white")
    curve = latency_vs_rtt_figure(alpha=alpha, gamma=gamma, t_ar=t_ar, t_a=t_a, t_d=t_d, widget=True)
    regions = region_map_figure(gamma=gamma, t_ar=t_ar, t_a=t_a, t_d=t_d, n=61, widget=True)
    regions.add_scatter(x=[rtt], y=[alpha], mode="markers", marker={"color": "black", "size": 12, "symbol": "star"},
                        name="you are here", row=1, col=1)

    def update(_=None):
        v = {k: x.value for k, x in s.items()}
        kw = {"alpha": v["alpha"], "gamma": int(v["gamma"]), "t_ar": v["t_ar"], "t_a": v["t_a"], "t_d": v["t_d"]}
        lat = [float(latency_per_token(m, rtt=v["rtt"], **kw)) for m in MODES]
        new_curve = latency_vs_rtt_figure(rtt_max=max(300.0, 1.2 * v["rtt"]), **kw)
        new_map = region_map_figure(gamma=kw["gamma"], t_ar=v["t_ar"], t_a=v["t_a"], t_d=v["t_d"], n=61)
        with bars.batch_update():
            bars.data[0].y = lat
        refresh(curve, new_curve)
        with regions.batch_update():
            for old, new in zip(regions.data, new_map.data):
                if isinstance(new, go.Heatmap):
                    old.z, old.text = new.z, new.text
            regions.data[-1].x, regions.data[-1].y = [v["rtt"]], [v["alpha"]]
            regions.layout.title = new_map.layout.title  # the title names gamma and the times: keep it current
        be = float(rtt_breakeven(v["alpha"], kw["gamma"], v["t_ar"], v["t_a"]))
        best = MODES[int(np.argmin(lat))]
        text.value = (f"<b>fastest: {MODE_LABELS[best]}</b>; sync DSD beats cloud AR "
                      + (f"below RTT = {be:.0f} ms" if be >= 0 else "at no RTT")
                      + f"; pipelining hides RTT up to {kw['gamma'] * v['t_a']:.0f} ms; "
                      f"capacity gain 1 + gamma*t_d/t_v = {float(capacity_gain(kw['gamma'], v['t_d'], v['t_ar'])):.2f}")

    for x in s.values():
        x.observe(update, names="value")
    update()
    return w.VBox([w.HBox([w.VBox(list(s.values())[:3]), w.VBox(list(s.values())[3:])]), text, bars, curve, regions])


__all__ = ["conditional_acceptance_figure", "measured_latency_figure", "MODE_COLORS", "MODE_LABELS", "breakeven_table_figure", "capacity_figure", "dsd_panel",
           "latency_vs_rtt_figure", "region_map_figure"]
