"""Figures and the slider panel of the cross-paper notebook (07): ELDR x BalanceRoute pairs."""

from __future__ import annotations

from typing import Any

import ipywidgets as w
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from moelab.viz.common import color_for, refresh, slider


def pairs_figure(table: pd.DataFrame, *, widget: bool = False, title: str = "") -> go.Figure:
    """p50 / p99 TPOT gain of every (instance router x rank router) pair over JSQ x JSQ: bars grouped
    by instance router, one colour per rank router (``cross.pair_gains_table`` rows)."""
    fig = go.FigureWidget(make_subplots(rows=1, cols=2, subplot_titles=("p50 TPOT gain over jsq x jsq (%)",
                                                                        "p99 TPOT gain over jsq x jsq (%)"))) \
        if widget else make_subplots(rows=1, cols=2, subplot_titles=("p50 TPOT gain over jsq x jsq (%)",
                                                                      "p99 TPOT gain over jsq x jsq (%)"))
    for rank, g in table.groupby("rank_router", sort=False):
        for col, metric in ((1, "tpot_ms_p50_gain_pct"), (2, "tpot_ms_p99_gain_pct")):
            fig.add_bar(x=g["instance_router"], y=g[metric], name=f"rank: {rank}", marker_color=color_for(rank),
                        legendgroup=rank, showlegend=col == 1, row=1, col=col)
    fig.update_layout(barmode="group", template="plotly_white", xaxis_title="instance router",
                      xaxis2_title="instance router", yaxis_title="p50 TPOT gain (%)",
                      yaxis2_title="p99 TPOT gain (%)", title=title or "ELDR picks the instance, BalanceRoute picks the rank")
    return fig


def causes_figure(table: pd.DataFrame) -> go.Figure:
    """The two mechanisms side by side: distinct experts per layer per step (ELDR's lever) and the
    barrier imbalance of KV load across ranks (BalanceRoute's lever), per pair."""
    # short panel titles (the y titles define the quantities): at the book's 688-px column the two long ones ran into
    # each other ("per stepbarrier idle work"); the wider gap keeps the right y title off the left panel's bars
    fig = make_subplots(rows=1, cols=2, subplot_titles=("ELDR's lever", "BalanceRoute's lever"),
                        horizontal_spacing=0.14)
    for rank, g in table.groupby("rank_router", sort=False):
        fig.add_bar(x=g["instance_router"], y=g["distinct_per_layer_step"], name=f"rank: {rank}",
                    marker_color=color_for(rank), legendgroup=rank, row=1, col=1)
        fig.add_bar(x=g["instance_router"], y=g["avg_imbalance"], name=f"rank: {rank}", marker_color=color_for(rank),
                    legendgroup=rank, showlegend=False, row=1, col=2)
    fig.update_xaxes(title_text="instance router")
    fig.update_yaxes(title_text="distinct experts / layer / step", row=1, col=1)
    fig.update_yaxes(title_text="I = G·M − Σ L<sub>g</sub> (KV tokens)", row=1, col=2)
    fig.update_layout(barmode="group", template="plotly_white", title="Where each gain comes from")
    return fig


def panel_title(K: int, G: int, load: float, tau: float, attention_share: float) -> str:
    """The panel's title: the setting its bars were computed at (so it changes with every slider)."""
    return (f"K = {K} instances x G = {G} ranks, load {load:g}x, τ = {tau:g}, "
            f"attention {attention_share:.0%} of a rank step")


def panel(run: Any, *, K: int, G: int, load: float, tau: float, attention_share: float) -> Any:
    """Sliders K, G, load (x slot capacity), tau and attention share; each change re-runs the pair grid
    through ``run(K=, G=, load=, tau=, attention_share=) -> pair_gains_table`` and redraws the bars."""
    sk = slider("instances K", K, 1, 16, 1, integer=True)
    sg = slider("ranks per instance G", G, 1, 16, 1, integer=True)
    sr = slider("load (x slot capacity)", load, 0.3, 2.0, 0.1)
    # tau >= 2 admits every instance into the band (cosines lie in [-1, 1]): the slider reaches JSQ
    st = slider("ELDR band τ", tau, 0.0, 2.0, 0.05)
    sa = slider("attention share of a rank step", attention_share, 0.05, 0.9, 0.05)
    first = run(K=K, G=G, load=load, tau=tau, attention_share=attention_share)
    fig = pairs_figure(first, widget=True, title=panel_title(K, G, load, tau, attention_share))
    status = w.HTML()

    def say(table: pd.DataFrame) -> None:
        status.value = f"arrival rate {float(table['rate'].iloc[0]):.1f} req/s" if "rate" in table.columns else ""

    def update(_: Any = None) -> None:
        status.value = "running..."
        table = run(K=sk.value, G=sg.value, load=sr.value, tau=st.value, attention_share=sa.value)
        refresh(fig, pairs_figure(table, title=panel_title(sk.value, sg.value, sr.value, st.value, sa.value)))
        say(table)

    say(first)

    for s in (sk, sg, sr, st, sa):
        s.observe(update, names="value")
    return w.VBox([w.HBox([w.VBox([sk, sg, sr]), w.VBox([st, sa, status])]), fig])


__all__ = ["causes_figure", "pairs_figure", "panel", "panel_title"]
