"""Figures and the interactive panel of notebook 06 (from your deployment: a live vLLM trace, the Hugging Face
fallback's capture, or a recorded trace file; the figures' titles name which, :func:`trace_source`)."""

from __future__ import annotations

from typing import Any

import ipywidgets as w
import numpy as np
import plotly.graph_objects as go

from moelab.viz.common import color_for, slider

#: how each of notebook 06's capture backends got its trace, as a figure's title says it
_CAPTURED = {"vllm": "captured through vLLM", "hf": "captured through the Hugging Face backend"}


def trace_source(backend: str, trace_file: str | None = None) -> str:
    """Where notebook 06's trace came from, in the words a figure's title uses.

    Parameters
    ----------
    backend : str
        The notebook's ``backend``: ``"vllm"`` (a live engine), ``"hf"`` (the Hugging Face fallback) or ``"file"``
        (a trace recorded elsewhere, read from ``trace_file``).
    trace_file : str or None
        The file's name; required with ``backend="file"``.

    Returns
    -------
    str
        E.g. ``"captured through vLLM"`` or ``"read from my_trace.npz"``.
    """
    if backend == "file":
        if not trace_file:
            raise ValueError("backend 'file' needs the trace_file the trace was read from")
        return f"read from {trace_file}"
    if backend not in _CAPTURED:
        raise ValueError(f"backend must be one of {sorted([*_CAPTURED, 'file'])}; got {backend!r}")
    return _CAPTURED[backend]


def _with_source(title: str, source: str | None) -> str:
    return title if not source else f"{title}<br><sup>trace {source}</sup>"


def fig_signature_similarity(signatures: np.ndarray, domains: list[str], *, source: str | None = None) -> go.Figure:
    """Cosine similarity of every pair of request signatures, requests grouped by domain.

    Each domain's block is labelled once at its centre on both axes and framed by thin lines, so a reader
    sees which bright square is which domain without one tick per request.

    Parameters
    ----------
    signatures : ndarray
        One unit-norm signature per request (rows).
    domains : list of str
        Each request's domain label.
    source : str or None
        Where the trace came from (:func:`trace_source`), named under the title; None names none.
    """
    names = np.asarray(domains)
    order = np.argsort(names, kind="stable")
    sim = signatures[order] @ signatures[order].T
    grouped = names[order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    ends = np.r_[starts[1:], grouped.size]
    centres = ((starts + ends - 1) / 2).tolist()
    labels = [str(grouped[i]) for i in starts]
    hover = [[f"{domains[i]} #{i} vs {domains[j]} #{j}" for j in order] for i in order]
    fig = go.Figure(go.Heatmap(z=sim, text=hover, hovertemplate="%{text}: cosine %{z:.2f}<extra></extra>",
                               colorscale="Viridis", zmin=0, zmax=1, colorbar={"title": "cosine"}))
    for edge in starts[1:] - 0.5:  # a thin frame between two domains' blocks
        for axis in ("x", "y"):
            line = {"x0": edge, "x1": edge, "y0": -0.5, "y1": grouped.size - 0.5} if axis == "x" else \
                {"y0": edge, "y1": edge, "x0": -0.5, "x1": grouped.size - 0.5}
            fig.add_shape(type="line", line={"color": "white", "width": 1}, **line)
    ticks = {"tickmode": "array", "tickvals": centres, "ticktext": labels, "showgrid": False}
    fig.update_layout(title=_with_source("Prefill signatures of the trace (requests grouped by domain)", source),
                      template="plotly_white", xaxis={**ticks, "title": "request (grouped by prompt domain)"},
                      yaxis={**ticks, "title": "request (grouped by prompt domain)", "autorange": "reversed"})
    return fig


def fig_domain_experts(trace: Any, layer: int, *, source: str | None = None) -> go.Figure:
    """Share of prefill expert activations per domain in one MoE layer (where locality comes from).

    Parameters
    ----------
    trace : RequestTrace
        A trace with domain labels.
    layer : int
        The MoE layer drawn.
    source : str or None
        Where the trace came from (:func:`trace_source`), named under the title; None names none.
    """
    codes, names = trace.domain_codes()
    counts = trace.prefill_counts[:, layer, :].astype(np.float64)
    share = np.stack([counts[codes == d].sum(axis=0) for d in range(len(names))])
    share /= np.maximum(share.sum(axis=1, keepdims=True), 1)
    fig = go.Figure(go.Heatmap(z=share, x=[f"e{e}" for e in range(share.shape[1])], y=names, colorscale="Blues",
                               colorbar={"title": "share"}))
    fig.update_layout(title=_with_source(f"Which experts each domain's prompts use (MoE layer {layer})", source),
                      xaxis_title="expert", yaxis_title="prompt domain", template="plotly_white")
    return fig


def fig_distinct_experts(distinct: dict[str, float], n_workers: int, tau: float | None = None) -> go.Figure:
    """Mean distinct experts per layer per decode step under each router (``tau``: ELDR's band, named in
    the title when given, so a panel's title follows its slider)."""
    names = list(distinct)
    fig = go.Figure(go.Bar(x=names, y=[distinct[n] for n in names], marker_color=[color_for(n) for n in names],
                           text=[f"{distinct[n]:.2f}" for n in names], textposition="outside"))
    band = "" if tau is None else f", ELDR τ = {tau:g}"
    fig.update_layout(title=f"Distinct experts loaded per layer per decode step<br><sup>{n_workers} decode workers{band}</sup>",
                      xaxis_title="router", yaxis_title="distinct experts / layer / step", template="plotly_white")
    return fig


def tau_panel(compute: Any, distinct: dict[str, float], n_workers: int, tau: float) -> Any:
    """A FigureWidget of :func:`fig_distinct_experts` whose ELDR bar follows a tau slider;
    ``compute(tau) -> distinct experts under ELDR``."""
    fw = go.FigureWidget(fig_distinct_experts(distinct, n_workers, tau))
    # tau >= 2 admits every worker into the band (cosines lie in [-1, 1]): the slider reaches plain JSQ
    s = slider("ELDR band τ", tau, 0.0, 2.0, 0.05)
    names = list(distinct)

    def update(change: Any) -> None:
        values = dict(distinct, eldr=float(compute(change["new"])))
        with fw.batch_update():
            fw.data[0].y = [values[n] for n in names]
            fw.data[0].text = [f"{values[n]:.2f}" for n in names]
            fw.layout.title.text = fig_distinct_experts(values, n_workers, change["new"]).layout.title.text

    s.observe(update, names="value")
    return w.VBox([s, fw])
