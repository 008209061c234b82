"""Figures and the interactive panel of the AFD-sizing notebook (03_afd_ratio)."""

from __future__ import annotations

import dataclasses

import ipywidgets as w
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from moelab.afd import (
    AFDCoefficients,
    coefficients_from_tables,
    idle_crossing,
    idle_ratios,
    optimal_ratio,
    simulated_optimum,
    stage_times,
    throughput_per_instance,
)
from moelab.viz.common import color_for, refresh, slider

_IDLE_COLORS = {side: color_for(side) for side in ("attention", "ffn")}  # the lab's palette


# Axis words for each coefficient unit: "ms" must not lose its "s" the way a plural would ("tokens per m").
_UNIT_SINGULAR = {"cycles": "cycle", "cycle": "cycle", "ms": "ms", "us": "µs", "s": "second", "seconds": "second"}


def unit_singular(unit: str) -> str:
    """The time unit as it reads after "tokens per": ``"cycles"`` -> ``"cycle"``, ``"ms"`` -> ``"ms"``."""
    return _UNIT_SINGULAR.get(unit, unit)


def signed_pct(value: float) -> str:
    """A signed percentage for prose: one decimal (``+7.3%``), or one significant digit when it would round to
    zero (``-0.004%``, never ``-0.0%``, which reads as a sign without a size).

    Parameters
    ----------
    value : float
        The percentage (``7.3`` for 7.3%).

    Returns
    -------
    str
    """
    value = float(value)
    if value == 0 or abs(value) >= 0.05:
        return f"{value:+.1f}%"
    return f"{value:+.1g}%"


def _theory_grid(r_max: float) -> np.ndarray:
    return np.linspace(0.5, max(r_max, 2.0), 400)


def throughput_figure(df: pd.DataFrame, *, B: int, mu_P: float, mu_D: float, N: float | None,
                      coeffs: AFDCoefficients | None = None, widget: bool = False) -> go.Figure:
    """Throughput per instance vs r: the closed form (line), the simulator (markers), r* (dashed)."""
    c = coeffs or AFDCoefficients.paper()
    r_star = optimal_ratio(B, mu_P, mu_D, N, c)
    grid = _theory_grid(max(df["r"].max(), 1.5 * r_star))
    fig = go.FigureWidget() if widget else go.Figure()
    fig.add_scatter(x=grid, y=throughput_per_instance(grid, B, mu_P, mu_D, N, c), mode="lines", name="theory",
                    line={"color": color_for("theory")})
    fig.add_scatter(x=df["r"], y=df["sim_throughput"], mode="markers+lines", name="simulation",
                    marker={"color": color_for("simulation"), "size": 9}, line={"dash": "dot", "width": 1})
    fig.add_vline(x=r_star, line_dash="dash", line_color="black", annotation_text=f"r* = {r_star:.2f}")
    horizon = "N = inf" if N is None else f"N = {N:,.0f}"  # N comes from a log slider: 10**3.25 is not round
    fig.update_layout(title=f"Throughput per instance (B={B}, mu_P={mu_P:g}, mu_D={mu_D:g}, {horizon})",
                      xaxis_title="r = attention instances per FFN instance",
                      yaxis_title=f"tokens per {unit_singular(c.unit)} per instance", template="plotly_white")
    return fig


IDLE_WAIT_SHARE = 0.0005  # an idle share that prints as at least 0.1%: that side visibly waits


def idle_title(df: pd.DataFrame) -> str:
    """The idle figure's title, true of the curves it draws: the theory's cross at zero idle (one side always
    works flat out); the simulation's, where they cross inside the swept r, at the idle share read there.

    Parameters
    ----------
    df : pandas.DataFrame
        A sweep with the columns ``r``, ``sim_attention_idle`` and ``sim_ffn_idle`` (NaN when not simulated).

    Returns
    -------
    str
        The title, e.g. "Idle share of each side: theory crosses at zero idle; simulation at 5.1% (both still
        wait)".
    """
    head = "Idle share of each side: theory crosses at zero idle"
    if df[["sim_attention_idle", "sim_ffn_idle"]].isna().all().all():
        return head
    cross = idle_crossing(df)
    if cross is None:
        return head + "; simulation does not cross in the swept r"
    at = min(float(np.interp(cross, df["r"], df[f"sim_{side}_idle"])) for side in ("attention", "ffn"))
    return head + (f"; simulation at {at:.1%} (both still wait)" if at >= IDLE_WAIT_SHARE
                   else "; simulation near zero too")


def idle_figure(df: pd.DataFrame, *, B: int, mu_P: float, mu_D: float, N: float | None,
                coeffs: AFDCoefficients | None = None, widget: bool = False) -> go.Figure:
    """Attention and FFN idle ratios vs r: theory (lines) and simulation (markers)."""
    c = coeffs or AFDCoefficients.paper()
    grid = _theory_grid(df["r"].max())
    idle = idle_ratios(grid, B, mu_P, mu_D, N, c)
    fig = go.FigureWidget() if widget else go.Figure()
    for side, label in (("attention", "attention"), ("ffn", "FFN")):
        fig.add_scatter(x=grid, y=idle[side], mode="lines", name=f"{label} idle (theory)",
                        line={"color": _IDLE_COLORS[side]}, legendgroup=side)
        fig.add_scatter(x=df["r"], y=df[f"sim_{side}_idle"], mode="markers", name=f"{label} idle (simulation)",
                        marker={"color": _IDLE_COLORS[side], "size": 9, "symbol": "diamond"},
                        legendgroup=side)  # one side, theory and simulation: one colour
    fig.add_vline(x=optimal_ratio(B, mu_P, mu_D, N, c), line_dash="dash", line_color="black", annotation_text="r*")
    # the simulation's part on a line of its own: one line was cut at a book page's width
    head, _, sim = idle_title(df).partition("; ")
    fig.update_layout(title=head + (f"<br><sup>{sim}</sup>" if sim else ""),
                      xaxis_title="r = attention instances per FFN instance", yaxis_title="idle share of time",
                      yaxis_tickformat=".0%",
                      template="plotly_white")
    return fig


_TABLE_HEADER_PX, _TABLE_ROW_PX = 28, 26  # the r* table's header and row heights (pixels)


def ratio_table_figure(table: pd.DataFrame, N: float | None = 10_000) -> go.Figure:
    """The r* table as a compact plotly table: rows (B, mu_P), one column per mu_D; entries set by the
    FFN peak rather than attention balance are marked "(peak)"."""
    label = table.assign(text=[f"{r:.2f}" + (" (peak)" if b == "ffn_peak" else "")
                               for r, b in zip(table["r_star"], table["binding"])])
    wide = label.pivot_table(index=["B", "mu_P"], columns="mu_D", values="text", aggfunc="first").reset_index()
    header = ["B", "mu_P"] + [f"r* at mu_D={d:g}" for d in wide.columns[2:]]
    cells = [wide["B"], wide["mu_P"].map(lambda v: f"{v:g}")] + [wide[c] for c in wide.columns[2:]]
    fig = go.Figure(go.Table(header={"values": header, "fill_color": "#dbe6f3", "height": _TABLE_HEADER_PX},
                             cells={"values": cells, "height": _TABLE_ROW_PX}))
    # tall enough for every row: a plotly table cut by its figure hides the last rows behind a scroll bar
    margin = {"t": 60, "b": 10, "l": 20, "r": 20}
    fig.update_layout(title=f"r* for each workload (N = {N} requests per instance and microbatch)", margin=margin,
                      height=margin["t"] + margin["b"] + _TABLE_HEADER_PX + _TABLE_ROW_PX * len(wide) + 10)
    return fig


def measured_figure(res, *, title: str | None = None) -> go.Figure:
    """Independent simulation (measured stages, real lengths) vs the fitted closed form: throughput per
    instance over r (top, with r* and the simulated optimum) and the residual sim/theory - 1 (bottom)."""
    f = res.frame
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.68, 0.32], vertical_spacing=0.06)
    fig.add_scatter(x=f["r"], y=f["theory_throughput"], mode="lines", name="theory (six coefficients fitted)",
                    line={"color": color_for("theory")}, row=1, col=1)
    fig.add_scatter(x=f["r"], y=f["sim_throughput"], mode="markers+lines", name="independent simulation",
                    marker={"color": color_for("simulation"), "size": 7}, line={"dash": "dot", "width": 1}, row=1, col=1)
    fig.add_scatter(x=f["r"], y=f["sim_vs_theory_pct"], mode="markers+lines", name="residual, sim / theory - 1 (%)",
                    marker={"color": color_for("simulation"), "symbol": "diamond"}, showlegend=False, row=2, col=1)
    fig.add_hline(y=0, line_color="#999", row=2, col=1)
    # the two markers' labels lean away from each other (the left one to its left), so close values never overlap
    lines = sorted(((res.r_star, f"r* = {res.r_star:.2f}", "dash"), (res.r_sim, f"sim opt = {res.r_sim}", "dot")))
    for (x, label, dash), side in zip(lines, ("top left", "top right")):
        fig.add_vline(x=x, line_dash=dash, line_color="black", annotation_text=label, annotation_position=side,
                      row=1, col=1)
    if "ffn_extrapolated" in f and f["ffn_extrapolated"].any():  # r whose FFN batch r*B the table does not measure
        beyond = f.loc[f["ffn_extrapolated"], "r"]
        for row in (1, 2):
            fig.add_vrect(x0=float(beyond.min()) - 0.5, x1=float(beyond.max()) + 0.5, fillcolor="#888", opacity=0.1,
                          line_width=0, row=row, col=1)
        fig.add_annotation(x=float(beyond.max()), y=0, xref="x", yref="y domain", xanchor="right", yanchor="bottom",
                           text="shaded: FFN batch r·B above the measured table (projection)", showarrow=False,
                           font={"size": 11, "color": "#555"}, row=1, col=1)
    fig.update_yaxes(title_text=f"tokens per {unit_singular(res.unit)} per instance", row=1, col=1)
    fig.update_yaxes(title_text="residual %", row=2, col=1)
    fig.update_xaxes(title_text="r = attention instances per FFN instance", row=2, col=1)
    fig.update_layout(title=title or f"Independent simulation, B={res.B}, {res.lengths} lengths "
                      f"(mu_P={res.mu_P:.0f}, mu_D={res.mu_D:.0f})", template="plotly_white", height=560)
    return fig


def gap_map_figure(df: pd.DataFrame) -> go.Figure:
    """(simulated optimum - r*) / r* for every (B, mu_P, mu_D) cell, one panel per length distribution; each
    cell also names the term that sets r* there (``binding``: attn = attention balance, peak = the FFN peak,
    link = link balance)."""
    dists = list(dict.fromkeys(df["lengths"]))
    fig = make_subplots(rows=1, cols=len(dists), subplot_titles=dists, shared_yaxes=True)
    lim = float(max(10.0, df["gap_pct"].abs().max()))
    short = {"attention": "attn", "ffn_peak": "peak", "communication": "link"}
    cells = df.assign(x=[f"P{p:g}/D{q:g}" for p, q in zip(df["mu_P"], df["mu_D"])],
                      label=[f"{g:.1f} {short.get(b, b)}" for g, b in zip(df["gap_pct"], df.get("binding", [""] * len(df)))])
    for i, d in enumerate(dists, start=1):
        g = cells[cells["lengths"] == d]
        wide = g.pivot_table(index="B", columns="x", values="gap_pct", aggfunc="first", sort=False)
        text = g.pivot_table(index="B", columns="x", values="label", aggfunc="first", sort=False).reindex_like(wide)
        fig.add_trace(go.Heatmap(z=wide.to_numpy(), x=list(wide.columns), y=[str(b) for b in wide.index], zmin=-lim,
                                 zmax=lim, colorscale="RdBu", showscale=i == len(dists), colorbar={"title": {"text": "gap (%)"}},
                                 text=text.to_numpy(), texttemplate="%{text}",
                                 hovertemplate="B=%{y}, %{x}: %{z:.1f}% (%{text})<extra></extra>"), row=1, col=i)
    fig.update_yaxes(title_text="B (slots)", row=1, col=1)
    # a short x title per panel: the long one ran into its neighbour's at the book's 688-px column
    fig.update_xaxes(title_text="P: mean prompt, D: decode tokens", title_font={"size": 12})
    fig.update_layout(title="(simulated optimum - r*) / r*, % (|.| <= 10 is the paper's promise)<br><sup>cell: the gap "
                      "and the term that sets r* (attn: attention balance r_A; peak: the FFN peak r_peak)</sup>",
                      template="plotly_white", height=380)
    return fig


def afd_panel(B: int = 256, mu_P: float = 100, mu_D: float = 500, N: float = 10_000, *,
              r_values=(1, 2, 4, 8, 16, 24, 32), seed: int = 0):
    """Sliders for the workload and the six coefficients (or the H200 calibration) wired to
    FigureWidgets: throughput per instance (theory vs simulation) and idle ratios.

    The simulation runs the notebook headline's grid (:func:`moelab.afd.simulated_optimum`): ``r_values``, then
    every integer between the best of them's neighbours, so its peak and idle crossing are the headline's at the
    same workload and seed, not a coarser grid's."""
    paper = AFDCoefficients.paper()
    s_B = slider("B (slots per attention instance and microbatch)", B, 16, 1024, 16, integer=True)
    s_P = slider("mu_P (mean prompt)", mu_P, 0, 4000, 50)
    s_D = slider("mu_D (mean decode)", mu_D, 10, 4000, 10)
    # the simulator runs the same horizon N as the theory; 10^4.5 requests keep a sweep to a few seconds
    s_N = slider("log10 N (requests per instance and microbatch)", float(np.log10(N)), 2, 4.5, 0.25)
    coef = {name: slider(name, getattr(paper, name), 0, 4 * getattr(paper, name), getattr(paper, name) / 50)
            for name in ("a_A", "b_A", "a_F", "b_F", "a_C", "b_C")}
    coef["a_F"].min = paper.a_F / 50  # a_F must stay > 0
    h200 = w.Checkbox(value=False, description="use H200 calibration (Qwen3-30B-A3B, ms)")
    simulate_box = w.Checkbox(value=True, description="simulate (same N as the theory)")
    status = w.HTML()

    def params():
        coeffs = coefficients_from_tables("h200", B=int(s_B.value)) if h200.value else \
            dataclasses.replace(paper, **{k: s.value for k, s in coef.items()},
                                source=f"{paper.source}; coefficients set by the panel's sliders")
        return int(s_B.value), float(s_P.value), float(s_D.value), float(10**s_N.value), coeffs

    def frame(b, p, d, n, coeffs):
        if simulate_box.value:
            return simulated_optimum(b, p, d, requests=n, coeffs=coeffs, r_values=r_values, seed=seed).fine
        r = np.asarray(r_values, dtype=float)
        idle = idle_ratios(r, b, p, d, n, coeffs)
        return pd.DataFrame({"r": r, "sim_throughput": np.nan, "sim_attention_idle": np.nan,
                             "sim_ffn_idle": np.nan, "theory_attention_idle": idle["attention"]})

    b, p, d, n, coeffs = params()
    df = frame(b, p, d, n, coeffs)
    f_tp = throughput_figure(df, B=b, mu_P=p, mu_D=d, N=n, coeffs=coeffs, widget=True)
    f_idle = idle_figure(df, B=b, mu_P=p, mu_D=d, N=n, coeffs=coeffs, widget=True)

    def update(_=None):
        b, p, d, n, coeffs = params()
        for s in coef.values():
            s.disabled = h200.value
        df = frame(b, p, d, n, coeffs)
        new_tp = throughput_figure(df, B=b, mu_P=p, mu_D=d, N=n, coeffs=coeffs)
        new_idle = idle_figure(df, B=b, mu_P=p, mu_D=d, N=n, coeffs=coeffs)
        refresh(f_tp, new_tp)
        refresh(f_idle, new_idle)
        status.value = f"<b>r* = {optimal_ratio(b, p, d, n, coeffs):.2f}</b> &nbsp; coefficients: {coeffs.source}"

    for control in (s_B, s_P, s_D, s_N, h200, simulate_box, *coef.values()):
        control.observe(update, names="value")
    update()
    left = w.VBox([s_B, s_P, s_D, s_N, h200, simulate_box])
    right = w.VBox(list(coef.values()))
    return w.VBox([w.HBox([left, right]), status, f_tp, f_idle])


# the four stages a microbatch passes through in one step, in order (the two link directions are separate servers)
PIPELINE_STAGES = ("attention", "A→F link", "FFN", "F→A link")


def pipeline_schedule(stage_ms: dict[str, float], microbatches: int = 3, steps: int = 2) -> pd.DataFrame:
    """Start and end of every (microbatch, step, stage) when each stage is one server taking work in order.

    A microbatch's next step starts only after its F→A transfer is back; a stage serves microbatches
    first come, first served. In steady state a step of the bundle lasts as long as its slowest stage.

    Parameters
    ----------
    stage_ms : dict
        Duration of each of :data:`PIPELINE_STAGES` (any time unit, all > 0).
    microbatches : int
        Microbatches in flight (>= 1).
    steps : int
        Decode steps drawn per microbatch (>= 1).

    Returns
    -------
    pandas.DataFrame
        Columns ``microbatch, step, stage, start, end``.
    """
    if int(microbatches) < 1 or int(steps) < 1:
        raise ValueError(f"microbatches and steps must be >= 1, got microbatches={microbatches}, steps={steps}")
    missing = [name for name in PIPELINE_STAGES if name not in stage_ms]
    if missing or any(not np.isfinite(stage_ms[n]) or stage_ms[n] <= 0 for n in PIPELINE_STAGES):
        raise ValueError(f"stage_ms must give a finite time > 0 for each of {PIPELINE_STAGES}, got {stage_ms}")
    server_free = dict.fromkeys(PIPELINE_STAGES, 0.0)
    ready = [0.0] * int(microbatches)
    rows = []
    for step in range(int(steps)):
        for mb in range(int(microbatches)):
            t = ready[mb]
            for name in PIPELINE_STAGES:
                start = max(t, server_free[name])
                t = start + float(stage_ms[name])
                server_free[name] = t
                rows.append({"microbatch": mb, "step": step, "stage": name, "start": start, "end": t})
            ready[mb] = t
    return pd.DataFrame(rows)


def bundle_diagram(r: int = 4, B: int = 256, mu_P: float = 100, mu_D: float = 500, N: float | None = 10_000, *,
                   coeffs: AFDCoefficients | None = None, microbatches: int = 3, steps: int = 2) -> go.Figure:
    """The rA-1F bundle (top: r attention instances feeding one FFN instance) and its four-stage pipeline
    (bottom: when each microbatch occupies each stage), with stage times from the closed form's linear model.

    Parameters
    ----------
    r : int
        Attention instances drawn (1 to 12, so the boxes stay readable).
    B, mu_P, mu_D, N : float
        The workload, as in :func:`moelab.afd.stage_times`.
    coeffs : AFDCoefficients, optional
        Stage-latency coefficients; the paper's fit by default.
    microbatches, steps : int
        Microbatches in flight and steps drawn in the timeline.
    """
    r = int(r)
    if not 1 <= r <= 12:
        raise ValueError(f"r must be an integer in [1, 12] (attention instances drawn), got {r}")
    c = coeffs or AFDCoefficients.paper()
    st = stage_times(np.array([float(r)]), B, mu_P, mu_D, N, c)
    t_A, t_C, t_F = float(st["t_A"][0]), float(st["t_C"][0]), float(st["t_F"][0])
    durations = {"attention": t_A, "A→F link": t_C, "FFN": t_F, "F→A link": t_C}
    sched = pipeline_schedule(durations, microbatches, steps)
    fig = make_subplots(rows=2, cols=1, row_heights=[0.45, 0.55], vertical_spacing=0.14,
                        subplot_titles=(f"an rA–1F bundle: r = {r} attention instances × B = {B} slots<br>→ one FFN "
                                        f"instance ({r * B} tokens per step)",
                                        f"one step = the slowest stage: t_cyc = max(t_A, t_C, t_F) = "
                                        f"{max(t_A, t_C, t_F):.3g} {c.unit}"))
    # top: boxes drawn as shapes in a 0..10 x 0..4 canvas
    height = 3.6 / r
    for i in range(r):
        y0 = 0.2 + i * height
        fig.add_shape(type="rect", x0=0.3, x1=3.3, y0=y0 + 0.05 * height, y1=y0 + 0.9 * height,
                      fillcolor=color_for("attention"), opacity=0.35, line={"color": color_for("attention")},
                      row=1, col=1)
        fig.add_annotation(x=1.8, y=y0 + 0.47 * height, text=f"attention {i + 1}: B slots + KV cache",
                           showarrow=False, font={"size": 10}, row=1, col=1)
        fig.add_annotation(x=6.6, y=2.0, ax=3.3, ay=y0 + 0.47 * height, xref="x", yref="y", axref="x", ayref="y",
                           showarrow=True, arrowhead=2, arrowcolor="#777", text="", row=1, col=1)
    fig.add_shape(type="rect", x0=6.6, x1=9.7, y0=1.2, y1=2.8, fillcolor=color_for("ffn"), opacity=0.35,
                  line={"color": color_for("ffn")}, row=1, col=1)
    fig.add_annotation(x=8.15, y=2.0, text=f"FFN instance<br>(MoE weights)<br>r·B = {r * B} tokens", showarrow=False,
                       font={"size": 11}, row=1, col=1)
    fig.update_xaxes(range=[0, 10], visible=False, row=1, col=1)
    fig.update_yaxes(range=[0, 4], visible=False, row=1, col=1)
    # bottom: the pipeline timeline, one bar per (microbatch, step, stage)
    stage_colors = {"attention": color_for("attention"), "A→F link": "#636363", "FFN": color_for("ffn"),
                    "F→A link": "#bdbdbd"}  # the two links: dark and light grey, told apart at a glance
    for name in PIPELINE_STAGES:
        part = sched[sched["stage"] == name]
        fig.add_bar(x=part["end"] - part["start"], base=part["start"], y=[name] * len(part), orientation="h",
                    marker={"color": stage_colors[name], "line": {"color": "white", "width": 1}}, name=name,
                    text=[f"mb{m + 1}" for m in part["microbatch"]], textposition="inside",
                    hovertemplate="%{text}: %{base:.3g} to %{x:.3g} long<extra>" + name + "</extra>", row=2, col=1)
    fig.update_yaxes(title_text="stage", categoryorder="array", categoryarray=list(PIPELINE_STAGES)[::-1], row=2, col=1)
    fig.update_xaxes(title_text=f"time ({c.unit})", row=2, col=1)
    fig.update_layout(template="plotly_white", height=620, barmode="overlay", showlegend=False,
                      title="The problem: how many attention instances should feed one FFN instance?")
    return fig


__all__ = ["IDLE_WAIT_SHARE", "PIPELINE_STAGES", "afd_panel", "bundle_diagram", "pipeline_schedule", "signed_pct", "unit_singular", "gap_map_figure", "idle_figure", "idle_title", "measured_figure", "ratio_table_figure", "throughput_figure"]
