"""Figures and the interactive panel of notebook 01 (ELDR)."""

from __future__ import annotations

from typing import Any

import ipywidgets as w
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from moelab.eldr import PAPER_DECODE_WORKERS, paper_rate_scale
from moelab.viz.common import color_for, refresh, slider

#: the light box behind a label drawn over bars or heatmap cells (dark text on a dark cell does not read)
_LABEL_BACKGROUND = "rgba(255, 255, 255, 0.85)"


def _color(name: str) -> str:
    return color_for(name)


def fig_costmodel(layer_model: Any, layer_table: pd.DataFrame) -> go.Figure:
    """Measured vs predicted whole-layer latency, training and held-out points apart."""
    fig = go.Figure()
    for label, rep, sym in (("training half", layer_model.train_report, "circle"), ("held-out", layer_model.test_report, "diamond")):
        fig.add_scatter(x=rep.measured * 1e3, y=rep.predicted * 1e3, mode="markers", name=f"{label} "
                        f"(median |err| {rep.median_abs_err_pct:.1f}%)", marker={"symbol": sym, "size": 8})
    hi = float(layer_table["ms_per_layer"].max() * 1e3 * 1.05)
    fig.add_scatter(x=[0, hi], y=[0, hi], mode="lines", name="y = x", line={"dash": "dot", "color": "#999"})
    fig.update_layout(title="Decode-layer cost model vs H200 measurements (Qwen3-30B-A3B-shaped layer)",
                      xaxis_title="measured µs per layer", yaxis_title="predicted µs per layer", template="plotly_white")
    return fig


def fig_greedy_curve(curve: list[float], *, calibration_requests: int | None = None,
                     patience: int | None = None) -> go.Figure:
    """Spearman rho of the greedy layer mask as layers are added, measured on the calibration requests the mask is
    fitted on (:attr:`moelab.eldr.signature.SignatureBuilder.curve`), not on held-out ones.

    Parameters
    ----------
    curve : list of float
        The rho after each greedy addition.
    calibration_requests : int, optional
        How many requests the curve is measured on (named in the title).
    patience : int, optional
        The search's stopping rule (additions without a new best), named on the x axis.

    Returns
    -------
    go.Figure
    """
    fig = go.Figure(go.Scatter(x=np.arange(1, len(curve) + 1), y=curve, mode="lines+markers", name="Spearman rho"))
    best = int(np.argmax(curve))
    fig.add_scatter(x=[best + 1], y=[curve[best]], mode="markers", marker={"size": 14, "color": _color("eldr")},
                    name=f"kept: {best + 1} layers (rho {curve[best]:.3f})")
    on = "the calibration requests" if calibration_requests is None else f"the {calibration_requests} calibration requests"
    stop = "" if patience is None else f"; stops after {patience} additions without a new best"
    fig.update_layout(title=f"Greedy layer selection on {on}:<br>prefill-signature vs decode-profile distance correlation",
                      xaxis_title=f"layers chosen (greedy order{stop})",
                      yaxis_title="Spearman rho (calibration requests)", template="plotly_white")
    return fig


def fig_rate_sweep(df: pd.DataFrame) -> go.Figure:
    """p50 TPOT and distinct experts per layer per step vs arrival rate, one line per router."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("p50 TPOT", "distinct experts read per MoE layer and step"))
    order = sorted(df["router"].unique(), key=lambda r: r == "domain_oracle")  # oracle drawn last
    # one marker shape per router, drawn larger first: routers whose results coincide (small runs often make
    # the load balancers identical) stay visible as nested markers instead of hiding one another
    symbols = ("circle", "square", "diamond", "triangle-up", "x", "cross", "triangle-down", "star")
    for k, router in enumerate(order):
        g = df[df["router"] == router]
        g = g.sort_values("rate")
        # the oracle is dashed on top: where it coincides with ELDR both stay visible
        style = {"color": _color(router), "width": 4 if router == "eldr" else 2,
                 "dash": "dash" if router == "domain_oracle" else "solid"}
        marker = {"symbol": symbols[k % len(symbols)], "size": max(6, 16 - 2 * k), "color": _color(router)}
        fig.add_scatter(x=g["rate"], y=g["tpot_ms_p50"], mode="lines+markers", name=router, line=style, row=1, col=1,
                        legendgroup=router, marker=marker)
        fig.add_scatter(x=g["rate"], y=g["distinct_per_layer_step"], mode="lines+markers", name=router, line=style,
                        row=1, col=2, legendgroup=router, showlegend=False, marker=marker)
    fig.update_xaxes(title_text=f"arrival rate (req/s at {PAPER_DECODE_WORKERS} decode workers)")
    fig.update_yaxes(title_text="p50 TPOT (ms per output token)", row=1, col=1)
    fig.update_yaxes(title_text="distinct experts (count per layer per step)", row=1, col=2)
    fig.update_layout(title="Decode cluster: every router across arrival rates", template="plotly_white")
    return fig


def fig_paper_comparison(cmp: pd.DataFrame) -> go.Figure:
    """Our relative p50 TPOT gain of ELDR over the best baseline vs the paper's, per rate."""
    fig = go.Figure()
    x = [f"{r:g} req/s" for r in cmp["rate"]]
    fig.add_bar(x=x, y=cmp["paper_gain_pct"], name="paper: p50 TPOT (MI300X, vLLM, Task workload)", marker_color=_color("paper"))
    fig.add_bar(x=x, y=cmp["tpot_gain_pct"], name="moelab: p50 TPOT (H200 cost model, synthetic workload)", marker_color=_color("eldr"))
    fig.add_bar(x=x, y=cmp["distinct_reduction_pct"], name="moelab: distinct experts per step", marker_color="#ff9896")
    low = float(cmp["paper_gain_pct"].min())  # from the paper's table (data/public/eldr-results), not typed in
    fig.add_hline(y=low, line_dash="dot", annotation_text=f"paper's lowest TPOT gain at these rates {low:.1f}%",
                  annotation_bgcolor=_LABEL_BACKGROUND)
    fig.update_layout(barmode="group", title="ELDR vs the best of RR/Random/JSQ/P2C<br><sup>p50 TPOT gain (its reduction) and distinct experts</sup>",
                      xaxis_title=f"arrival rate (req/s at {PAPER_DECODE_WORKERS} decode workers)",
                      yaxis_title="reduction vs the best baseline (%)",
                      template="plotly_white")
    return fig


def fig_paper_two_sided(cmp: pd.DataFrame) -> go.Figure:
    """Per rate: the paper's gain, ours on the calibrated synthetic workload and (when the table has it)
    ours on the real trace, with the ours/paper ratio on a second axis (1 = same gain)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("p50 TPOT gain over the best baseline (%)", "ours / paper"))
    x = [f"{r:g}" for r in cmp["rate"]]
    fig.add_bar(x=x, y=cmp["paper_gain_pct"], name="paper", marker_color=_color("paper"), row=1, col=1)
    fig.add_bar(x=x, y=cmp["tpot_gain_pct"], name="ours, synthetic", marker_color=_color("eldr"), row=1, col=1)
    fig.add_scatter(x=x, y=cmp["ratio_synthetic"], name="ratio, synthetic", marker_color=_color("eldr"), row=1, col=2)
    if "real_tpot_gain_pct" in cmp:
        fig.add_bar(x=x, y=cmp["real_tpot_gain_pct"], name="ours, real trace (projection)", marker_color="#9467bd",
                    row=1, col=1)
        fig.add_scatter(x=x, y=cmp["ratio_real"], name="ratio, real trace", marker_color="#9467bd", row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", row=1, col=2)
    fig.update_xaxes(title_text="arrival rate (req/s)")
    fig.update_yaxes(title_text="p50 TPOT gain (%)", row=1, col=1)
    fig.update_yaxes(title_text="our gain / paper's gain (1 = same)", row=1, col=2)
    fig.update_layout(barmode="group", template="plotly_white", title="ELDR vs the paper, two-sided")
    return fig


#: each regime-map metric: its title (what the colour is), its colour bar and its colour scale. Blue always means
#: ELDR does better: a gain over the best baseline is better when positive (RdBu), the gap to the domain-label
#: oracle (ELDR's p50 TPOT over the oracle's, minus one) when negative (the reversed scale, RdBu_r)
REGIME_METRICS: dict[str, dict[str, str]] = {
    "p50_gain_pct": {"title": "ELDR's p50 TPOT gain over the best baseline (%)", "colorbar": "p50 gain (%)",
                     "colorscale": "RdBu"},
    "p99_gain_pct": {"title": "ELDR's p99 TPOT gain over the best baseline (%)", "colorbar": "p99 gain (%)",
                     "colorscale": "RdBu"},
    "oracle_gap_pct": {"title": "ELDR's p50 TPOT gap to the domain-label oracle (%, above 0: ELDR slower)",
                       "colorbar": "oracle gap (%)", "colorscale": "RdBu_r"},
}


def fig_regime_map(df: pd.DataFrame, *, n_workers: int, tau: float, metric: str = "p50_gain_pct",
                   paper_rho: tuple[float, float] | None = None, real_point: tuple[float, float] | None = None) -> go.Figure:
    """Heatmap of one of :data:`REGIME_METRICS` (``metric``) over measured rho (y) x arrival rate (x) at one K and
    tau, with the paper's rho range shaded and the real trace's (rate, rho) point marked. Each metric has its own
    title and a colour scale on which blue means ELDR does better (reversed for the oracle gap)."""
    if metric not in REGIME_METRICS:
        raise ValueError(f"metric must be one of {list(REGIME_METRICS)}; got {metric!r}")
    d = df[(df["n_workers"] == n_workers) & np.isclose(df["tau"], tau)]
    if d.empty:
        raise ValueError(f"no regime-map rows at n_workers={n_workers}, tau={tau}")
    spec = REGIME_METRICS[metric]
    z = d.pivot_table(index="rho", columns="rate", values=metric)
    fig = go.Figure(go.Heatmap(z=z.to_numpy(), x=z.columns.astype(float), y=z.index.astype(float), zmid=0,
                               colorscale=spec["colorscale"], colorbar={"title": {"text": spec["colorbar"]}},
                               text=np.round(z.to_numpy(), 1), texttemplate="%{text}",
                               hovertemplate="rate %{x} req/s<br>rho %{y:.2f}<br>%{z:.1f}%<extra></extra>"))
    if paper_rho is not None:
        fig.add_hrect(y0=paper_rho[0], y1=paper_rho[1], line_width=2, line_dash="dash", fillcolor="rgba(0,0,0,0)",
                      annotation_text="paper's rho range", annotation_bgcolor=_LABEL_BACKGROUND)
    if real_point is not None:
        fig.add_scatter(x=[real_point[0]], y=[real_point[1]], mode="markers",
                        marker={"symbol": "star", "size": 16, "color": "black"}, showlegend=False)
        fig.add_annotation(x=real_point[0], y=real_point[1], text="real trace", showarrow=False, yshift=16,
                           bgcolor=_LABEL_BACKGROUND)  # a light box: readable on the darkest cell
    fig.update_layout(title=f"{spec['title']}, K={n_workers}, τ={tau:g}",
                      xaxis_title=f"arrival rate (req/s at {PAPER_DECODE_WORKERS} decode workers; simulated x K/"
                                  f"{PAPER_DECODE_WORKERS})",
                      yaxis_title="measured held-out count_idf rho", template="plotly_white", height=420)
    return fig


def _grid_control(description: str, values: list, value: Any) -> Any:
    """A slider over the values the grid was run at; a fixed label when only one was run (a slider with one
    stop would look like a control and do nothing)."""
    if len(values) >= 2:
        return w.SelectionSlider(options=values, value=value, description=description, continuous_update=False)
    return w.Label(value=f"{description} = {values[0]:g} (the only value run)")


def regime_panel(df: pd.DataFrame, *, n_workers: int | None = None, tau: float | None = None, **kw: Any) -> Any:
    """The regime map with K and tau sliders (over the values the grid has; a label where it has one) and a
    metric choice; the title follows the chosen K, tau and metric. The sliders start at ``n_workers`` and
    ``tau`` (values of the grid; default: its middle K and its smallest tau), so the panel can open on the
    same map as a saved :func:`fig_regime_map`; ``kw`` goes to :func:`fig_regime_map`."""
    ks = [int(x) for x in sorted(df["n_workers"].unique())]
    taus = [float(x) for x in sorted(df["tau"].unique())]
    if n_workers is not None and int(n_workers) not in ks:
        raise ValueError(f"n_workers must be one of the grid's K {ks}; got {n_workers!r}")
    if tau is not None and not np.isclose(taus, float(tau)).any():
        raise ValueError(f"tau must be one of the grid's tau {taus}; got {tau!r}")
    k = _grid_control("K", ks, ks[len(ks) // 2] if n_workers is None else int(n_workers))
    t = _grid_control("tau", taus, taus[0] if tau is None else taus[int(np.argmin(np.abs(np.subtract(taus, float(tau)))))])
    m = w.Dropdown(options=list(REGIME_METRICS), description="metric")

    def chosen() -> go.Figure:
        n_workers = k.value if isinstance(k, w.SelectionSlider) else ks[0]
        tau = t.value if isinstance(t, w.SelectionSlider) else taus[0]
        return fig_regime_map(df, n_workers=n_workers, tau=tau, metric=m.value, **kw)

    fig = go.FigureWidget(chosen())

    def update(_: Any = None) -> None:
        refresh(fig, chosen())

    for widget in (k, t, m):
        if not isinstance(widget, w.Label):
            widget.observe(update, names="value")
    return w.VBox([w.HBox([k, t, m]), fig])


# an ablation column's axis title where the prose writes it otherwise (the band width is τ in the notebook)
_ABLATION_AXIS: dict[str, str] = {"tau": "band width τ"}


def fig_ablation(df: pd.DataFrame, column: str, title: str) -> go.Figure:
    """p50 TPOT and distinct experts per configuration of one ablation column."""
    d = df.dropna(subset=["tpot_ms_p50"]) if "tpot_ms_p50" in df else df
    labels = [str(v) for v in d[column]]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("p50 TPOT (ms)", "distinct experts / layer / step"))
    fig.add_bar(x=labels, y=d["tpot_ms_p50"], marker_color=_color("eldr"), showlegend=False, row=1, col=1)
    fig.add_bar(x=labels, y=d["distinct_per_layer_step"], marker_color="#ff9896", showlegend=False, row=1, col=2)
    fig.update_xaxes(title_text=_ABLATION_AXIS.get(column, column))
    fig.update_yaxes(title_text="p50 TPOT (ms)", row=1, col=1)
    fig.update_yaxes(title_text="distinct experts / layer / step", row=1, col=2)
    fig.update_layout(title=title, template="plotly_white")
    return fig


def _explore_figure(res: dict[str, dict], router: str, *, geometry: str, workers: int, tau: float, rate: float
                    ) -> go.Figure:
    """The explore panel's figure: the chosen router next to JSQ, titled with every setting it shows."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TPOT (ms)", "distinct experts / layer / step"))
    for side, label in (("jsq", "jsq"), ("chosen", router)):
        m = res[side]
        fig.add_bar(x=["p50", "p99"], y=[m["tpot_ms_p50"], m["tpot_ms_p99"]], name=label, row=1, col=1,
                    legendgroup=side, marker_color=_color(label))  # one colour per router, in both subplots
        fig.add_bar(x=["mean"], y=[m["distinct_per_layer_step"]], name=label, row=1, col=2, showlegend=False,
                    legendgroup=side, marker_color=_color(label))
    sim_rate = rate * paper_rate_scale(workers)
    fig.update_xaxes(title_text="TPOT percentile over requests", row=1, col=1)
    fig.update_xaxes(title_text="over decode steps", row=1, col=2)
    fig.update_yaxes(title_text="TPOT (ms)", row=1, col=1)
    fig.update_yaxes(title_text="distinct experts / layer / step", row=1, col=2)
    fig.update_layout(template="plotly_white", barmode="group", height=400,
                      title=f"{router} vs JSQ on {geometry}: K={workers}, τ={tau:g}, {rate:g} req/s at "
                            f"{PAPER_DECODE_WORKERS} workers = {sim_rate:.3g} req/s simulated "
                            f"({sim_rate / workers:.3g} per worker)")
    return fig


def eldr_panel(setups: dict[str, Any], run_one: Any, *, n_requests: int, output_len: int, with_workers: Any,
               routers: tuple[str, ...], workers: int = 16, rate: float = 60.0) -> Any:
    """Interactive panel: geometry, router, workers K, tau and the arrival rate -> p50/p99 TPOT and distinct
    experts of the chosen router next to JSQ, recomputed by the simulator on each change.

    The rate is in the paper's units: req/s at :data:`PAPER_DECODE_WORKERS` decode workers. The simulator
    runs ``rate * K / 16``, so moving K changes the cluster's size, never the load each worker sees (the
    title says what was simulated). ``run_one(setup, router, rate=, tau=, n_requests=, output_len=)`` (e.g.
    :func:`moelab.eldr.experiments.run_one`) is called with the rate in that same unit.
    """
    geometry = w.Dropdown(options=list(setups), description="geometry", style={"description_width": "initial"})
    router = w.Dropdown(options=list(routers), value="eldr", description="router")
    workers = slider("decode workers K", workers, 2, 32, 1, integer=True)
    tau = slider("tau", 0.1, 0.0, 2.0, 0.05)
    rate = slider(f"rate (req/s at {PAPER_DECODE_WORKERS} decode workers)", float(rate), 1.0, 200.0, 1.0)
    fig = go.FigureWidget(make_subplots(rows=1, cols=2))
    cache: dict[tuple, Any] = {}

    def update(_: Any = None) -> None:
        key = (geometry.value, workers.value)
        if key not in cache:
            base = setups[geometry.value]
            cache[key] = base if base.n_workers == workers.value else with_workers(base, workers.value)
        setup = cache[key]
        # ELDR's one rate unit (req/s at 16 workers): run_one simulates rate * K / 16, the same load per worker at every K
        res = {name: run_one(setup, r, rate=rate.value, tau=tau.value, n_requests=n_requests, output_len=output_len)
               for name, r in (("jsq", "jsq"), ("chosen", router.value))}
        refresh(fig, _explore_figure(res, router.value, geometry=geometry.value, workers=workers.value,
                                     tau=tau.value, rate=rate.value))

    for widget in (geometry, router, workers, tau, rate):
        widget.observe(update, names="value")
    update()
    return w.VBox([w.HBox([geometry, router]), workers, tau, rate, fig])


__all__ = ["REGIME_METRICS", "eldr_panel", "fig_ablation", "fig_costmodel", "fig_greedy_curve", "fig_paper_comparison", "fig_paper_two_sided",
           "fig_rate_sweep", "fig_regime_map", "regime_panel"]
