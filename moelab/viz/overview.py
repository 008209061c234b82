"""The overview notebook (00_overview): the map of the lab and the physical fact behind ELDR."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from moelab.costmodel import MODEL_SHAPES, MoEStepModel
from moelab.viz.common import color_for, refresh

# One row per paper: what it claims (in plain words) and where the lab shows it.
LAB_MAP: list[dict[str, str]] = [
    {"paper": "ELDR (arXiv 2607.00466, ATC 2026)", "package": "moelab.eldr", "notebook": "01_eldr",
     "claim": "Routing each decoded request to a worker whose batch already uses the same experts cuts "
              "median TPOT vs the best load balancer, outputs unchanged (paper table: data/public/eldr-results)."},
    {"paper": "Hierarchy Drafting (arXiv 2502.05609, NAACL 2025)", "package": "moelab.hd",
     "notebook": "02_hierarchy_drafting",
     "claim": "Drafting from n-gram stores ordered by temporal locality (context, model, corpus) speeds "
              "decoding losslessly and more robustly than other database drafters on Spec-Bench."},
    {"paper": "AFD ratio (arXiv 2601.21351, ICML 2026)", "package": "moelab.afd", "notebook": "03_afd_ratio",
     "claim": "A closed form gives the best number of attention instances per FFN instance; "
              "a simulator finds the optimum within 10% of it."},
    {"paper": "Speculation at a Distance (arXiv 2606.25091)", "package": "moelab.dsd", "notebook": "04_dsd_rtt",
     "claim": "Edge-cloud speculative decoding wins on latency only inside a bounded RTT window; its real "
              "case is capacity: 1 + gamma*t_d/t_v times more clients per server."},
    {"paper": "BalanceRoute (arXiv 2605.06113)", "package": "moelab.balanceroute", "notebook": "05_balanceroute",
     "claim": "Routing by a margin-aware F-score (BR-0) and a short lookahead (BR-H) roughly halves DP "
              "barrier imbalance vs JSQ and raises throughput."},
    {"paper": "ELDR x BalanceRoute (cross-paper)", "package": "moelab.cross", "notebook": "07_cross_paper",
     "claim": "Expert-locality routing of instances and KV-balance routing of ranks act on different terms of one "
              "decode step: does each gain survive the other, and do they add up?"},
    {"paper": "Your deployment", "package": "moelab.capture, moelab.costmodel", "notebook": "06_from_your_deployment",
     "claim": "Measure your own GPU and traces, then rerun every analysis above on them."},
]


def lab_map() -> pd.DataFrame:
    """The map of the lab as a DataFrame (paper, claim, notebook, package)."""
    return pd.DataFrame(LAB_MAP)[["paper", "claim", "notebook", "package"]]


def lab_map_figure() -> go.Figure:
    """The lab map as a plotly table."""
    df = lab_map()
    fig = go.Figure(go.Table(columnwidth=[160, 420, 120, 130],
                             header={"values": list(df.columns), "fill_color": "#dbe6f3", "align": "left"},
                             cells={"values": [df[c] for c in df.columns], "align": "left", "height": 40}))
    fig.update_layout(title="moelab: five papers, one notebook each, one cross-paper experiment", height=580)
    return fig


def moe_points(table: pd.DataFrame, B: int, method: str = "bmm_active") -> pd.DataFrame:
    """Measured MoE-layer times at batch ``B`` (rows: model, D, ms_per_layer)."""
    rows = table[(table["B"] == B) & (table["method"] == method)]
    if rows.empty:
        raise ValueError(f"B must be one of {sorted(table['B'].unique())}; got {B!r}")
    return rows[["model", "D", "ms_per_layer"]].sort_values(["model", "D"]).reset_index(drop=True)


def moe_experts_figure(table: pd.DataFrame, model: MoEStepModel, B: int = 256, *, widget: bool = False) -> go.Figure:
    """MoE layer time vs distinct experts D at batch B: measured H200 points (markers) and the fitted
    :class:`MoEStepModel` (lines), one colour per model shape."""
    pts = moe_points(table, B, model.method)
    fig = go.FigureWidget() if widget else go.Figure()
    for name, g in pts.groupby("model", sort=True):
        shape = MODEL_SHAPES[name].moe
        D = np.arange(1, shape.num_experts + 1)
        fig.add_scatter(x=D, y=1e3 * model.predict_ms(shape, B, D), mode="lines", name=f"{name} (fit)",
                        line={"color": color_for(name)}, legendgroup=name)
        fig.add_scatter(x=g["D"], y=1e3 * g["ms_per_layer"], mode="markers", name=f"{name} (measured)",
                        marker={"color": color_for(name), "size": 9}, legendgroup=name)
    fig.update_layout(title=f"One MoE layer at decode on an H200, batch B={B}: time grows with DISTINCT experts",
                      xaxis_title="distinct experts the batch activates (D)", yaxis_title="microseconds per layer",
                      template="plotly_white")
    return fig


def moe_panel(table: pd.DataFrame, model: MoEStepModel, B: int = 256) -> Any:
    """A slider over the measured batch sizes wired to the MoE figure."""
    import ipywidgets as w

    batches = sorted(int(b) for b in table["B"].unique())
    pick = w.SelectionSlider(options=batches, value=B if B in batches else batches[-1], description="batch B",
                             continuous_update=False)
    fig = moe_experts_figure(table, model, pick.value, widget=True)

    def update(_=None):
        new = moe_experts_figure(table, model, pick.value)
        refresh(fig, new)

    pick.observe(update, names="value")
    return w.VBox([pick, fig])


__all__ = ["LAB_MAP", "lab_map", "lab_map_figure", "moe_experts_figure", "moe_panel", "moe_points"]
