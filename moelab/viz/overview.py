"""The overview notebook (00_overview): the map of the lab and the physical fact behind ELDR."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import ipywidgets as w
import numpy as np
import pandas as pd
import plotly.graph_objects as go

from moelab.costmodel import MODEL_SHAPES, MoEStepModel, expected_distinct_experts
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
              "case is capacity: 1 + γ·t_d/t_v times more clients per server."},
    {"paper": "BalanceRoute (arXiv 2605.06113)", "package": "moelab.balanceroute", "notebook": "05_balanceroute",
     "claim": "Routing by a margin-aware F-score (BR-0) and a short lookahead (BR-H) roughly halves DP "
              "barrier imbalance vs JSQ and raises throughput."},
    {"paper": "ELDR x BalanceRoute (cross-paper)", "package": "moelab.cross", "notebook": "07_cross_paper",
     "claim": "Expert-locality routing of instances and KV-balance routing of ranks act on different terms of one "
              "decode step: does each gain survive the other, and do they add up?"},
    {"paper": "Your deployment", "package": "moelab.capture, moelab.costmodel", "notebook": "06_from_your_deployment",
     "claim": "Capture expert traces from your own vLLM engine and run ELDR's locality and routing analysis on them."},
]


def lab_map() -> pd.DataFrame:
    """The map of the lab as a DataFrame (paper, claim, notebook, package)."""
    return pd.DataFrame(LAB_MAP)[["paper", "claim", "notebook", "package"]]


def _wrap_name(name: str, width: int = 16) -> str:
    """``name`` broken after its ``_``, ``.`` or ``,`` into lines of at most ``width`` characters where it can be
    (plotly's table cuts a word wider than its column instead of wrapping it)."""
    lines: list[str] = []
    for part in re.split(r"(?<=[_.,])", name):
        if lines and len(lines[-1]) + len(part) <= width:
            lines[-1] += part
        else:
            lines.append(part.lstrip())
    return "<br>".join(lines)


def lab_map_figure() -> go.Figure:
    """The lab map as a plotly table."""
    df = lab_map()
    # a claim wraps to up to three lines in its column and a notebook or package name is broken at its "_" or ".":
    # rows are sized to hold that (the book's column is about 690 px wide), the figure to hold every row
    shown = df.assign(notebook=df["notebook"].map(_wrap_name), package=df["package"].map(_wrap_name))
    fig = go.Figure(go.Table(columnwidth=[140, 400, 150, 160],
                             header={"values": list(df.columns), "fill_color": "#dbe6f3", "align": "left"},
                             cells={"values": [shown[c] for c in shown.columns], "align": "left", "height": 70}))
    fig.update_layout(title="moelab: five papers, one notebook each<br><sup>plus a cross-paper experiment and one for "
                            "your deployment</sup>",
                      height=140 + 80 * len(df), margin={"l": 20, "r": 20, "t": 70, "b": 20})
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
    # shapes with similar expert sizes have nearly the same line: a dash and a marker symbol per model keep a
    # line drawn over another one visible
    dashes, symbols = ("solid", "dash", "dot", "dashdot", "longdash"), ("circle", "square", "diamond", "x", "triangle-up")
    for i, (name, g) in enumerate(pts.groupby("model", sort=True)):
        shape = MODEL_SHAPES[name].moe
        D = np.arange(1, shape.num_experts + 1)
        fig.add_scatter(x=D, y=1e3 * model.predict_ms(shape, B, D), mode="lines", name=f"{name} (fit)",
                        line={"color": color_for(name), "dash": dashes[i % len(dashes)]}, legendgroup=name)
        fig.add_scatter(x=g["D"], y=1e3 * g["ms_per_layer"], mode="markers", name=f"{name} (measured)",
                        marker={"color": color_for(name), "size": 9, "symbol": symbols[i % len(symbols)]},
                        legendgroup=name)
    fig.update_layout(title=f"One MoE layer at decode on an H200, batch B={B}<br><sup>time grows with DISTINCT experts"
                            "</sup>",
                      xaxis_title="distinct experts the batch activates (D)", yaxis_title="microseconds per layer",
                      template="plotly_white")
    return fig


def moe_panel(table: pd.DataFrame, model: MoEStepModel, B: int = 256) -> Any:
    """A slider over the measured batch sizes wired to the MoE figure."""
    batches = sorted(int(b) for b in table["B"].unique())
    pick = w.SelectionSlider(options=batches, value=B if B in batches else batches[-1], description="batch B",
                             continuous_update=False)
    fig = moe_experts_figure(table, model, pick.value, widget=True)

    def update(_=None):
        new = moe_experts_figure(table, model, pick.value)
        refresh(fig, new)

    pick.observe(update, names="value")
    return w.VBox([pick, fig])


# The decode step as a sum of terms, left to right as the formula in notebook 00 writes it, with the paper
# whose method moves each term and the notebook that shows it.
DECODE_TERMS: list[dict[str, str]] = [
    {"term": "1 / tokens per target forward", "symbol": "1/a", "paper": "HD", "notebook": "02_hierarchy_drafting",
     "how": "drafts several tokens, one forward verifies them all"},
    {"term": "max over DP ranks (the barrier)", "symbol": "max_g", "paper": "BalanceRoute",
     "notebook": "05_balanceroute", "how": "routes so the slowest rank is less slow"},
    {"term": "attention over the KV cache", "symbol": "t_attn", "paper": "AFD", "notebook": "03_afd_ratio",
     "how": "sizes attention vs FFN machines so neither stage waits"},
    {"term": "MoE weight reads (distinct experts D_g)", "symbol": "t_MoE(D_g)", "paper": "ELDR", "notebook": "01_eldr",
     "how": "batches requests that use the same experts"},
    {"term": "round trip not hidden by drafting", "symbol": "t_RTT", "paper": "DSD", "notebook": "04_dsd_rtt",
     "how": "drafts on the edge while the round trip is in flight"},
]


# the one term of the sum that no paper's method makes smaller: drawn without a box, its caption says why
UNMOVED_TERM: dict[str, str] = {
    "term": "transfers between machines", "symbol": "+ t_link )", "paper": "no paper",
    "how": "AFD's ratio only keeps the link from being the stage the others wait for (r_C)", "notebook": "03_afd_ratio"}

# characters per caption line under the unboxed t_link (a narrower piece than a box)
_UNMOVED_CAPTION_CHARS = 14

# one colour per term, distinct from each other (the lab palette gives two of these paper names one colour)
_TERM_COLORS = dict(zip([row["paper"] for row in DECODE_TERMS], ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]))


# characters per caption line under a term's box (10 px text, a box about 140 px wide in a 1000 px figure)
_CAPTION_CHARS = 20


def _wrap(text: str, width: int) -> str:
    """``text`` wrapped at ``width`` characters, lines joined with plotly's ``<br>``."""
    return "<br>".join(textwrap.wrap(text, width)) or text


def decode_step_figure() -> go.Figure:
    """The decode step drawn once as a sum of terms, each labelled with the paper that moves it.

    A schematic: box widths are equal on purpose (the sizes depend on the model, batch and hardware; the
    notebooks measure them), the point is which paper acts on which term. ``t_link`` (:data:`UNMOVED_TERM`) has
    no box and a grey caption: no paper's method makes a transfer faster.
    """
    fig = go.Figure()
    pieces = ["t_token  =", "1/a", "×  [  max_g (", "t_attn", "+", "t_MoE(D_g)", "+ t_link )", "+", "t_RTT", "]"]
    boxed = {row["symbol"]: row for row in DECODE_TERMS}
    x = 0.0
    for piece in pieces:
        width = 1.6 if piece in boxed or piece.startswith("×") else 0.9 if len(piece) > 2 else 0.4
        if piece.startswith("×"):  # the barrier's max carries its own box: BalanceRoute acts on it
            row = boxed["max_g"]
        else:
            row = boxed.get(piece)
        if row is not None:
            color = _TERM_COLORS[row["paper"]]
            fig.add_shape(type="rect", x0=x, x1=x + width, y0=0.45, y1=1.0, fillcolor=color, opacity=0.25,
                          line={"color": color})
            # each caption wrapped to its box's width, so neighbouring captions never run into each other
            term, how = (_wrap(row[k], _CAPTION_CHARS) for k in ("term", "how"))
            fig.add_annotation(x=x + width / 2, y=0.3, text=f"<b>{row['paper']}</b><br>{term}<br>"
                               f"<i>{how}</i><br>notebook {row['notebook'][:2]}", showarrow=False,
                               font={"size": 10, "color": color}, yanchor="top")
        elif piece == UNMOVED_TERM["symbol"]:  # no box: no paper shrinks it, and the caption says so
            term, how = (_wrap(UNMOVED_TERM[k], _UNMOVED_CAPTION_CHARS) for k in ("term", "how"))
            fig.add_annotation(x=x + width / 2, y=0.3, text=f"<b>{UNMOVED_TERM['paper']}</b><br>{term}<br><i>{how}</i>"
                               f"<br>notebook {UNMOVED_TERM['notebook'][:2]}", showarrow=False,
                               font={"size": 10, "color": "#666"}, yanchor="top")
        fig.add_annotation(x=x + width / 2, y=0.72, text=piece, showarrow=False, font={"size": 15})
        x += width + 0.1
    fig.update_xaxes(visible=False, range=[-0.1, x])
    fig.update_yaxes(visible=False, range=[-1.3, 1.1])
    fig.update_layout(title="One decode step, term by term, and which paper moves which term",
                      template="plotly_white", height=420, margin={"l": 10, "r": 10})
    return fig


def distinct_experts_figure(num_experts: int, top_k: int, batch: int, *, guess: float | None = None,
                            batch_max: int | None = None) -> go.Figure:
    """The expected distinct experts ``D = E(1 - (1 - k/E)^B)`` of a random batch against B, with the
    naive ``min(E, k·B)``, the point at ``batch`` and, when given, the reader's guess.

    Parameters
    ----------
    num_experts, top_k : int
        Experts per MoE layer E and experts per token k (1 <= k <= E).
    batch : int
        The batch the reader predicted for (>= 1).
    guess : float, optional
        The reader's guess of D at ``batch``.
    batch_max : int, optional
        Right end of the axis (default: four times ``batch``, at least enough to saturate).
    """
    if int(batch) < 1:
        raise ValueError(f"batch must be an integer >= 1, got {batch}")
    right = int(batch_max or max(4 * int(batch), 8))
    grid = np.arange(0, right + 1)
    curve = expected_distinct_experts(grid, num_experts, top_k)
    at = float(expected_distinct_experts(int(batch), num_experts, top_k))
    fig = go.Figure()
    fig.add_scatter(x=grid, y=curve, mode="lines", name="D = E(1 - (1 - k/E)^B)", line={"color": color_for("theory")},
                    legendgroup="theory")
    fig.add_scatter(x=grid, y=np.minimum(num_experts, top_k * grid), mode="lines", name="min(E, k·B): no overlap",
                    line={"dash": "dot", "color": "#999"})
    fig.add_scatter(x=[batch], y=[at], mode="markers+text", name=f"B = {batch}", text=[f"D = {at:.1f}"],
                    textposition="top left", marker={"size": 11, "color": color_for("theory")},
                    legendgroup="theory")  # a point of the curve: the curve's colour
    if guess is not None:
        fig.add_scatter(x=[batch], y=[float(guess)], mode="markers", name="your guess",
                        marker={"size": 12, "symbol": "x", "color": "#d62728"})
    fig.update_layout(title=f"Distinct experts a random batch touches (E = {num_experts}, k = {top_k})",
                      xaxis_title="tokens in the batch (B)", yaxis_title="distinct experts (D)", template="plotly_white")
    return fig


def moe_layer_reading(points: pd.DataFrame, model: str, B: int) -> dict[str, float]:
    """What the measured points of one MoE layer at batch ``B`` say, read precisely: the two ends of the measured
    range, the D that random routing of ``B`` tokens would touch, the measured point nearest half the largest D,
    and the measured slope (microseconds per distinct expert).

    The ends are benchmark settings, not two realistic batches: the calibration spreads the batch's ``B * k``
    expert slots evenly over exactly ``D`` experts, so the smallest ``D`` (= ``k``) is every token on the same
    ``k`` experts. The times are one MoE layer's expert FFNs (no router, shared experts, attention or other layer).

    Parameters
    ----------
    points : DataFrame
        :func:`moe_points`' rows (``model``, ``D``, ``ms_per_layer``) at batch ``B``.
    model : str
        A registered model shape (:data:`moelab.costmodel.MODEL_SHAPES`) with at least two measured points.
    B : int
        The batch the points were measured at (tokens), >= 1.

    Returns
    -------
    dict
        ``D_min``, ``D_max``, ``us_at_D_min``, ``us_at_D_max``, ``measured_ratio`` (max over min); ``D_random``
        (expected distinct experts of ``B`` randomly routed tokens); ``D_half``, ``us_at_D_half`` and
        ``half_saving_pct`` (the measured point nearest ``D_max / 2`` and what it saves against ``D_max``, %);
        ``us_per_expert`` (least-squares slope of the measured points).
    """
    if model not in MODEL_SHAPES:
        raise ValueError(f"model must be one of {sorted(MODEL_SHAPES)}; got {model!r}")
    if int(B) != B or B < 1:
        raise ValueError(f"B must be an integer >= 1 (tokens in the batch); got {B!r}")
    g = points[points["model"] == model].sort_values("D")
    if len(g) < 2:
        raise ValueError(f"points need at least two measured D for {model!r}; got {len(g)}")
    D = g["D"].to_numpy(dtype=float)
    us = 1e3 * g["ms_per_layer"].to_numpy(dtype=float)
    half = int(np.argmin(np.abs(D - D[-1] / 2)))
    shape = MODEL_SHAPES[model].moe
    return {"D_min": int(D[0]), "D_max": int(D[-1]), "us_at_D_min": float(us[0]), "us_at_D_max": float(us[-1]),
            "measured_ratio": float(us[-1] / us[0]),
            "D_random": float(expected_distinct_experts(int(B), shape.num_experts, shape.top_k)),
            "D_half": int(D[half]), "us_at_D_half": float(us[half]),
            "half_saving_pct": float(100 * (1 - us[half] / us[-1])),
            "us_per_expert": float(np.polyfit(D, us, 1)[0])}


__all__ = ["DECODE_TERMS", "LAB_MAP", "UNMOVED_TERM", "decode_step_figure", "distinct_experts_figure", "lab_map", "lab_map_figure", "moe_experts_figure", "moe_layer_reading", "moe_panel", "moe_points"]
