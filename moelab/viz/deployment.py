"""Figures and the interactive panel of notebook 06 (from your deployment: a live vLLM trace)."""

from __future__ import annotations

from typing import Any

import ipywidgets as w
import numpy as np
import plotly.graph_objects as go

from moelab.viz.common import color_for, slider


def fig_signature_similarity(signatures: np.ndarray, domains: list[str]) -> go.Figure:
    """Cosine similarity of every pair of request signatures, requests grouped by domain."""
    order = np.argsort(np.asarray(domains), kind="stable")
    sim = signatures[order] @ signatures[order].T
    labels = [f"{domains[i]} #{i}" for i in order]
    fig = go.Figure(go.Heatmap(z=sim, x=labels, y=labels, colorscale="Viridis", zmin=0, zmax=1,
                               colorbar={"title": "cosine"}))
    fig.update_layout(title="Prefill signatures of the live trace (requests grouped by domain)",
                      template="plotly_white", xaxis={"showticklabels": False, "title": "request (grouped by domain)"},
                      yaxis={"showticklabels": False, "title": "request (grouped by domain)"})
    return fig


def fig_domain_experts(trace: Any, layer: int) -> go.Figure:
    """Share of prefill expert activations per domain in one MoE layer (where locality comes from)."""
    codes, names = trace.domain_codes()
    counts = trace.prefill_counts[:, layer, :].astype(np.float64)
    share = np.stack([counts[codes == d].sum(axis=0) for d in range(len(names))])
    share /= np.maximum(share.sum(axis=1, keepdims=True), 1)
    fig = go.Figure(go.Heatmap(z=share, x=[f"e{e}" for e in range(share.shape[1])], y=names, colorscale="Blues",
                               colorbar={"title": "share"}))
    fig.update_layout(title=f"Which experts each domain's prompts use (MoE layer {layer}, captured through vLLM)",
                      xaxis_title="expert", yaxis_title="prompt domain", template="plotly_white")
    return fig


def fig_distinct_experts(distinct: dict[str, float], n_workers: int, tau: float | None = None) -> go.Figure:
    """Mean distinct experts per layer per decode step under each router (``tau``: ELDR's band, named in
    the title when given, so a panel's title follows its slider)."""
    names = list(distinct)
    fig = go.Figure(go.Bar(x=names, y=[distinct[n] for n in names], marker_color=[color_for(n) for n in names],
                           text=[f"{distinct[n]:.2f}" for n in names], textposition="outside"))
    band = "" if tau is None else f", ELDR tau = {tau:g}"
    fig.update_layout(title=f"Distinct experts loaded per layer per decode step ({n_workers} decode workers{band})",
                      xaxis_title="router", yaxis_title="distinct experts / layer / step", template="plotly_white")
    return fig


def tau_panel(compute: Any, distinct: dict[str, float], n_workers: int, tau: float) -> Any:
    """A FigureWidget of :func:`fig_distinct_experts` whose ELDR bar follows a tau slider;
    ``compute(tau) -> distinct experts under ELDR``."""
    fw = go.FigureWidget(fig_distinct_experts(distinct, n_workers, tau))
    # tau >= 2 admits every worker into the band (cosines lie in [-1, 1]): the slider reaches plain JSQ
    s = slider("ELDR band tau", tau, 0.0, 2.0, 0.05)
    names = list(distinct)

    def update(change: Any) -> None:
        values = dict(distinct, eldr=float(compute(change["new"])))
        with fw.batch_update():
            fw.data[0].y = [values[n] for n in names]
            fw.data[0].text = [f"{values[n]:.2f}" for n in names]
            fw.layout.title.text = fig_distinct_experts(values, n_workers, change["new"]).layout.title.text

    s.observe(update, names="value")
    return w.VBox([s, fw])
