"""Figures and the interactive panel of notebook 02 (Hierarchy Drafting)."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as w
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from moelab.datasets import SPEC_BENCH_CATEGORIES
from moelab.viz.common import color_for, distinct_colors, slider

STORE_COLORS = {k: color_for(k) for k in ("W", "S", "L", "P", "bonus")}  # the lab's palette
#: a light box under a line's label (e.g. "AR = 1.00"): it runs across the bars, whose colours are dark
LABEL_BACKGROUND = "rgba(255, 255, 255, 0.85)"
# the stores as the lesson and NOTATION.md name them: the request's own text, the target's own earlier outputs, a
# generic corpus (REST's datastore)
STORE_NAMES = {"W": "W request store", "S": "S model-output store", "L": "L corpus store", "P": "PLD",
               "bonus": "target's own token"}
#: the axis of a figure of ``a``: "accepted" alone means accepted *draft* tokens (m) in this lab; the paper's mean
#: accepted tokens (MAT) counts the bonus token too, a = m + 1 per step (notebooks/NOTATION.md)
MAT_AXIS = "tokens per forward, a (MAT: m + 1, bonus included)"
METHOD_COLORS = {m: color_for(m) for m in ("AR", "PLD", "W-only", "S-only", "L-only", "HD(WSL)", "HD(LSW)", "HD(SWL)")}


def acceptance_html(tokenizer: Any, result: Any, *, max_steps: int | None = None) -> str:
    """The generated text token by token: accepted draft tokens coloured by the store that drafted them,
    the target's bonus token grey; a thin bar separates target forwards. The legend names only the sources of the
    tokens shown (a run without PLD shows no PLD swatch).

    Each token's text and tooltip is escaped once (``&``, ``<``, ``>``, and ``"`` inside the double-quoted tooltip;
    an apostrophe stays a character); a newline is shown as the character ``↵`` and a line break, and spacing is CSS,
    so the output holds no entity a viewer could show raw (:func:`moelab.viz.hygiene.html_output_problems`)."""
    spans = []
    shown: set[str] = set()  # the sources of the tokens shown: the legend names only these
    for i, step in enumerate(result.steps[:max_steps]):
        toks = [*zip(step.accepted, step.sources), (step.bonus, "bonus")]
        for tok, src in toks:
            if tok < 0:
                continue
            shown.add(src)
            text = html.escape(tokenizer.decode([tok]), quote=False).replace("\n", "\u21b5<br>")
            tip = html.escape(f"step {i}: {STORE_NAMES[src]}", quote=False).replace('"', "&quot;")
            spans.append(f'<span title="{tip}" style="background:{STORE_COLORS[src]};white-space:pre-wrap;'
                         f'color:{"#000" if src == "bonus" else "#fff"};padding:1px 2px;border-radius:3px">{text}</span>')
        spans.append('<span style="border-left:2px solid #444;margin:0 1px"></span>')
    legend = " ".join(f'<span style="background:{c};color:{"#000" if k == "bonus" else "#fff"};padding:1px 4px;'
                      f'border-radius:3px">{html.escape(STORE_NAMES[k], quote=False)}</span>'
                      for k, c in STORE_COLORS.items() if k in shown)
    return (f'<div style="font-family:monospace;line-height:1.9">{"".join(spans)}</div>'
            f'<div style="margin-top:6px;font-size:90%">{legend}'
            f'<span style="margin-left:1em">| = one target forward</span></div>')


def fig_steps(result: Any, title: str = "", engine: str = "HF engine", method: str = "") -> go.Figure:
    """Tokens produced per target forward, stacked by the store that drafted them (+ the bonus token).

    ``method``, when given, is a first title line naming the method and its settings (the default title
    states only tokens, forwards and ``a``)."""
    n = len(result.steps)
    x = np.arange(n)
    fig = go.Figure()
    for src in ("W", "S", "L", "P"):
        y = [sum(1 for s in step.sources if s == src) for step in result.steps]
        if any(y):
            fig.add_bar(x=x, y=y, name=STORE_NAMES[src], marker_color=STORE_COLORS[src])
    fig.add_bar(x=x, y=[1] * n, name=STORE_NAMES["bonus"], marker_color=STORE_COLORS["bonus"])
    fig.update_layout(barmode="stack", template="plotly_white", xaxis_title="target forward (step)",
                      yaxis_title="tokens produced",
                      title=title or (f"{method}<br>" if method else "") + f"{len(result.tokens)} tokens in {n} forwards"
                                     f"<br><sup>a = {result.mean_accepted:.2f} tokens per forward; {engine}</sup>")
    return fig


def fig_verify_cost(curves: dict[str, Any]) -> go.Figure:
    """Relative cost of verifying q tokens in one forward, one line per curve (each measured on this machine; two
    curves of one engine, e.g. one timed now and a cached one, are told apart by colour and dash).

    ``curves``: ``{engine label: VerifyCost or DataFrame with q, ms_median}``."""
    fig = go.Figure()
    ticks: set[int] = set()
    colors = distinct_colors(list(curves), min_delta_e=40.0)  # two curves of one engine: clearly apart
    dashes = ("solid", "dash", "dot", "dashdot")  # and told apart without colour too
    for i, (label, c) in enumerate(curves.items()):
        if isinstance(c, pd.DataFrame):
            q, ms = c["q"].to_numpy(), c["ms_median"].to_numpy()
        else:
            d = c.as_dict()
            q, ms = np.asarray(d["qs"]), np.asarray(d["ms"])
        ticks.update(int(x) for x in q)
        fig.add_scatter(x=q, y=ms / ms[0], mode="lines+markers", name=label, marker_color=colors[label],
                        line={"color": colors[label], "dash": dashes[i % len(dashes)]})
    # a log axis labels only the measured q values (plotly's own log ticks add stray 2s and 5s between decades)
    fig.update_xaxes(type="log", tickmode="array", tickvals=sorted(ticks), ticktext=[str(t) for t in sorted(ticks)])
    fig.update_layout(template="plotly_white", xaxis_title="tokens verified in one forward (q)",
                      yaxis_title="cost relative to q = 1",
                      title="Verification cost of one forward against the tokens it verifies<br><sup>measured on this machine</sup>")
    return fig


def fig_mat_by_budget(summary: pd.DataFrame, engine: str = "HF engine") -> go.Figure:
    """Tokens per target forward ``a`` (the paper's MAT, bonus token included; column ``mean_accepted``), overall,
    against the verification budget, one line per method.

    ``summary`` rows need ``method`` labelled ``<name>@<budget>`` and ``category == "overall"``."""
    g = summary[(summary["category"] == "overall") & summary["method"].str.contains("@")].copy()
    g["name"] = g["method"].str.split("@").str[0]
    g["b"] = g["method"].str.split("@").str[1].astype(int)
    fig = go.Figure()
    for name, h in g.groupby("name", sort=False):
        h = h.sort_values("b")
        fig.add_scatter(x=h["b"], y=h["mean_accepted"], mode="lines+markers", name=name, marker_color=color_for(name))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="AR = 1.00", annotation_bgcolor=LABEL_BACKGROUND)
    fig.update_layout(template="plotly_white", xaxis_title="budget: draft tokens verified per forward",
                      yaxis_title=MAT_AXIS, title=f"Equal budgets: tokens per forward, a (MAT) ({engine})")
    return fig


def fig_speedup_by_category(summary: pd.DataFrame, engine: str = "vLLM engine", col: str = "speedup") -> go.Figure:
    """Speedup over AR per Spec-Bench category, one bar group per method (``engine`` names where it ran)."""
    cats = [*SPEC_BENCH_CATEGORIES, "overall"]
    fig = go.Figure()
    for m in [m for m in summary["method"].unique() if m != "AR"]:
        g = summary[summary["method"] == m].set_index("category").reindex(cats)
        fig.add_bar(x=cats, y=g[col], name=m, marker_color=color_for(m))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="AR", annotation_bgcolor=LABEL_BACKGROUND)
    budget = summary["budget"].dropna().unique() if "budget" in summary else []
    btxt = f", budget {int(budget[0])}" if len(budget) == 1 else ""
    fig.update_layout(barmode="group", template="plotly_white", xaxis_title="Spec-Bench category",
                      yaxis_title="speedup over AR (x)", title=f"Speedup over AR by category<br><sup>{engine}{btxt}</sup>")
    return fig


def fig_mat_by_category(summary: pd.DataFrame, methods: Sequence[str] | None = None,
                        engine: str = "HF engine") -> go.Figure:
    """Tokens per target forward ``a`` (the paper's MAT, bonus token included), per Spec-Bench category, one bar
    group per method."""
    cats = [*SPEC_BENCH_CATEGORIES, "overall"]
    methods = list(methods or [m for m in summary["method"].unique() if m != "AR"])
    fig = go.Figure()
    for m in methods:
        g = summary[summary["method"] == m].set_index("category").reindex(cats)
        fig.add_bar(x=cats, y=g["mean_accepted"], name=m, marker_color=color_for(m))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="AR = 1.00", annotation_bgcolor=LABEL_BACKGROUND)
    fig.update_layout(barmode="group", template="plotly_white", xaxis_title="Spec-Bench category",
                      yaxis_title=MAT_AXIS, title=f"Spec-Bench slice: tokens per forward, a (MAT), by category<br><sup>{engine}</sup>")
    return fig


def compare_column_method(column: str) -> str:
    """The method a column of :func:`moelab.hd.experiments.compare_published` draws: ``"PLD"`` for
    ``"PLD A100-80GB (published)"`` (method, device) and for ``"PLD@8 (HF CPU, slice, budget 8, ours)"`` (method,
    optional ``@budget``, engine), ``"HD (cost-aware)"`` for ``"HD (cost-aware)@8 (HF CPU, ..., ours)"``."""
    col = str(column).strip()
    if col.endswith("(published)"):
        head = col[: -len("(published)")].strip()
        return head.rsplit(" ", 1)[0] if " " in head else head  # drop the device
    return col.rsplit(" (", 1)[0].split("@", 1)[0].strip() if " (" in col else col.split("@", 1)[0]


def fig_published(compare: pd.DataFrame) -> go.Figure:
    """Speedup over AR per category: ours (each column names its engine) next to published rows.

    Each bar takes its method's colour from the lab's palette (:func:`moelab.viz.common.color_for`); a published
    bar is hatched and paler, and one method drawn both ways (ours and published) shares a legend group."""
    fig = go.Figure()
    for col in compare.columns[1:]:
        dash = "published" in col
        method = compare_column_method(col)
        fig.add_bar(x=compare["category"], y=compare[col], name=col, marker_color=color_for(method),
                    legendgroup=method.lower(), marker_pattern_shape="/" if dash else "",
                    opacity=0.6 if dash else 1.0)
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(barmode="group", template="plotly_white", xaxis_title="Spec-Bench category",
                      yaxis_title="speedup over AR (x)", title="Speedup over autoregressive decoding: ours vs the Spec-Bench leaderboard")
    return fig


def fig_store_shares(summary: pd.DataFrame, method: str = "HD(WSL)", engine: str = "HF engine",
                     title: str = "") -> go.Figure:
    """Per-category lookup-hit rate and share of accepted draft tokens of each store of ``method``.

    ``method`` selects the rows (its summary label); ``title``, when given, replaces the default title (which
    names the method by that label), e.g. to name the method as the lesson writes it. A store never asked in a
    category (no lookups, so no hit rate) is marked "not asked" where its hit-rate bar would be (an extra,
    legend-less bar trace of zero height carries the label)."""
    g = summary[summary["method"] == method]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("lookup hit rate", "share of accepted draft tokens"))
    for letter in "WSL":
        if f"{letter}_hit_rate" not in g:
            continue
        fig.add_bar(x=g["category"], y=g[f"{letter}_hit_rate"], name=STORE_NAMES[letter], offsetgroup=letter,
                    marker_color=STORE_COLORS[letter], row=1, col=1, legendgroup=letter)
        fig.add_bar(x=g["category"], y=g[f"{letter}_accept_share"], name=STORE_NAMES[letter], offsetgroup=letter,
                    marker_color=STORE_COLORS[letter], row=1, col=2, legendgroup=letter, showlegend=False)
        # a store never asked in a category has no hit rate (no lookups): "not asked" stands in its bar's place,
        # so the gap does not read as a 0% hit rate
        unasked = g[f"{letter}_hit_rate"].isna().to_numpy()
        if unasked.any():
            fig.add_bar(x=g["category"], y=np.where(unasked, 0.0, np.nan), offsetgroup=letter, legendgroup=letter,
                        name=f"{STORE_NAMES[letter]}: not asked", showlegend=False, marker_color=STORE_COLORS[letter],
                        text=np.where(unasked, f"{letter} not asked", ""), textposition="outside", textangle=-90,
                        textfont={"color": STORE_COLORS[letter], "size": 11}, cliponaxis=False, constraintext="none",
                        hovertemplate=f"%{{x}}: {letter} never asked (no lookups)<extra></extra>", row=1, col=1)
    fig.update_xaxes(title_text="Spec-Bench category")
    fig.update_yaxes(title_text="lookup hit rate (hits / lookups)", row=1, col=1)
    fig.update_yaxes(title_text="share of accepted draft tokens", row=1, col=2)
    fig.update_layout(barmode="group", template="plotly_white", title=title or f"{method}: which store pays off where ({engine})")
    return fig


#: where :func:`drafting_panel` starts: the paper's HD (7 candidates of 4 tokens, stores asked W, S, L), greedy
PANEL_START = {"candidates": 7, "length": 4, "order": "WSL", "temperature": 0.0}


def fixed_hd_settings(candidates: int, length: int, order: str, temperature: float) -> str:
    """How a figure names an HD (paper, fixed) run: its candidates, their length, the budget they make (draft
    tokens verified per forward, at most), the store order and the temperature."""
    return (f"HD (paper, fixed): {candidates} candidates × {length} tokens (budget {candidates * length}), "
            f"order {', '.join(order)}, temperature {temperature:g}")


def drafting_panel(run: Callable[[int, int, str, float], Any], tokenizer: Any, *, orders: Sequence[str] = (
        "WSL", "WLS", "SWL", "LSW", "W", "S", "L"), candidates: int = PANEL_START["candidates"],
        length: int = PANEL_START["length"]):
    """Sliders for candidates / length / order / temperature, wired to a FigureWidget and the coloured text.

    ``run(max_candidates, length, order, temperature)`` must return a generation result (it decodes with
    the real model, so each change takes as long as one short generation). The figure's title names the
    method and the settings it was decoded at (:func:`fixed_hd_settings`)."""
    first = run(candidates, length, orders[0], 0.0)
    fw = go.FigureWidget(fig_steps(first, method=fixed_hd_settings(candidates, length, orders[0], 0.0)))
    text = w.HTML(acceptance_html(tokenizer, first))
    s_cand = slider("candidates", candidates, 1, 16, 1, integer=True)
    s_len = slider("length", length, 1, 10, 1, integer=True)
    s_temp = slider("temperature", 0.0, 0.0, 1.5, 0.1)
    dd = w.Dropdown(options=list(orders), value=orders[0], description="order")

    def update(_=None) -> None:
        res = run(s_cand.value, s_len.value, dd.value, s_temp.value)
        new = fig_steps(res, method=fixed_hd_settings(s_cand.value, s_len.value, dd.value, s_temp.value))
        with fw.batch_update():
            fw.data = []
            for tr in new.data:
                fw.add_trace(tr)
            fw.layout.title = new.layout.title
        text.value = acceptance_html(tokenizer, res)

    for ctrl in (s_cand, s_len, s_temp, dd):
        ctrl.observe(update, names="value")
    return w.VBox([w.HBox([s_cand, s_len]), w.HBox([dd, s_temp]), fw, text])


__all__ = ["LABEL_BACKGROUND", "MAT_AXIS", "METHOD_COLORS", "PANEL_START", "STORE_COLORS", "acceptance_html",
           "compare_column_method", "drafting_panel", "fig_mat_by_budget", "fixed_hd_settings",
           "fig_mat_by_category", "fig_published", "fig_speedup_by_category", "fig_steps", "fig_store_shares",
           "fig_verify_cost"]
