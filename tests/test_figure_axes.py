"""Every plotted axis of the lab's figures has a title: ``untitled_axes`` itself, then each builder of
``moelab.viz`` on small synthetic inputs of the shape the notebooks pass (no models, no simulators)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

from moelab.viz import afd, balanceroute, cross, deployment, dsd, eldr, hd, overview
from moelab.viz.common import untitled_axes

# --- untitled_axes -------------------------------------------------------------------------------------


def test_finds_an_untitled_axis():
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    assert untitled_axes(fig) == ["xaxis", "yaxis"]
    fig.update_layout(xaxis_title="rate (req/s)")
    assert untitled_axes(fig) == ["yaxis"]
    fig.update_layout(yaxis_title="   ")  # blank is no title
    assert untitled_axes(fig) == ["yaxis"]
    fig.update_layout(yaxis_title="TPOT (ms)")
    assert untitled_axes(fig) == []


def test_only_axes_with_a_visible_trace_count():
    fig = make_subplots(rows=1, cols=3)
    fig.add_scatter(x=[1], y=[1], row=1, col=1)
    fig.add_scatter(x=[1], y=[1], row=1, col=2, visible=False)
    fig.add_scatter(x=[1], y=[1], row=1, col=3, visible="legendonly")  # one click away from drawn
    fig.update_xaxes(title_text="x")
    assert untitled_axes(fig) == ["yaxis", "yaxis3"]


def test_tables_pies_and_polar_traces_have_no_axes():
    assert untitled_axes(go.Figure(go.Table(header={"values": ["a"]}, cells={"values": [[1]]}))) == []
    assert untitled_axes(go.Figure([go.Pie(values=[1, 2]), go.Scatterpolar(r=[1], theta=[0]),
                                    go.Indicator(value=3)])) == []


def test_a_colour_bar_needs_a_title():
    fig = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]]))
    fig.update_layout(xaxis_title="RTT (ms)", yaxis_title="alpha")
    assert untitled_axes(fig) == ["colorbar0"]
    fig.update_traces(colorbar={"title": {"text": "gain (%)"}})
    assert untitled_axes(fig) == []
    fig.update_traces(showscale=False, colorbar={"title": {"text": ""}})  # no bar shown: nothing to name
    assert untitled_axes(fig) == []
    fig.add_scatter(x=[1], y=[1], marker={"color": [1], "showscale": True})
    assert untitled_axes(fig) == ["colorbar1"]


def test_hidden_axes_need_no_title():
    fig = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]], showscale=False))
    fig.update_layout(xaxis={"showticklabels": False}, yaxis={"visible": False})
    assert untitled_axes(fig) == []


def test_shared_grid_with_one_titled_axis_per_row_and_column():
    fig = make_subplots(rows=2, cols=2, shared_xaxes=True, shared_yaxes=True)
    for r in (1, 2):
        for c in (1, 2):
            fig.add_scatter(x=[1, 2], y=[r, c], row=r, col=c)
    assert untitled_axes(fig) == ["xaxis3", "xaxis4", "yaxis", "yaxis3"]
    fig.update_xaxes(title_text="RTT (ms)", row=2)
    fig.update_yaxes(title_text="alpha", col=1)
    assert untitled_axes(fig) == []


def test_matches_carries_the_title_but_an_unshared_neighbour_does_not():
    fig = make_subplots(rows=1, cols=2)
    fig.add_scatter(x=[1], y=[1], row=1, col=1)
    fig.add_scatter(x=[1], y=[1], row=1, col=2)
    fig.update_xaxes(title_text="r")
    fig.update_yaxes(title_text="throughput (tokens/s)", row=1, col=1)
    assert untitled_axes(fig) == ["yaxis2"]  # same row, but not shared: its own quantity
    fig.update_yaxes(matches="y", row=1, col=2)
    assert untitled_axes(fig) == []


def test_a_subplot_title_is_not_an_axis_title():
    fig = make_subplots(rows=1, cols=1, subplot_titles=["p50 TPOT (ms)"])
    fig.add_scatter(x=[1], y=[1])
    fig.update_xaxes(title_text="rate (req/s)")
    assert untitled_axes(fig) == ["yaxis"]


def test_browser_check_judges_what_the_page_drew():
    """tests/browser.py checks the figures on a live page with the same rules: the page's layout and each
    trace's axes (as plotly.js holds them: titles as objects, axes unset on single-axis traces)."""
    from tests.browser import untitled_figure_axes

    shared = make_subplots(rows=2, cols=1, shared_xaxes=True)  # the top x axis carries no title of its own
    shared.add_scatter(x=[1], y=[1], row=1, col=1)
    shared.add_scatter(x=[1], y=[1], row=2, col=1)
    shared.update_xaxes(title_text="RTT (ms)", row=2, col=1)
    shared.update_yaxes(title_text="ms per token")
    bare = go.Figure(go.Scatter(x=[1], y=[1]), layout={"title": {"text": "bare"}, "yaxis_title": "P(accept)"})

    def spec(fig):  # what JS_FIGURES returns: a trace's fields plotly.js holds (unset ones absent)
        keep = ("type", "xaxis", "yaxis", "visible", "showscale", "coloraxis", "colorbar")
        return {"layout": fig.layout.to_plotly_json(),
                "data": [{k: v for k, v in t.to_plotly_json().items() if k in keep} for t in fig.data]}

    table = {"layout": {}, "data": [{"type": "table", "xaxis": None, "yaxis": None, "visible": None}]}
    heat = go.Figure([go.Heatmap(z=[[1, 2]], colorbar={"title": {"text": "gain (%)"}}),
                      go.Heatmap(z=[[1, 2]], showscale=False, xaxis="x", yaxis="y")],
                     layout={"title": {"text": "heat"}, "xaxis_title": "rate", "yaxis_title": "rho"})
    bare_heat = go.Figure(go.Heatmap(z=[[1, 2]]), layout={"title": {"text": "map"}, "xaxis_title": "a",
                                                          "yaxis_title": "b"})
    page = SimpleNamespace(evaluate=lambda js: [spec(shared), table, spec(bare), spec(heat), spec(bare_heat)])
    assert untitled_figure_axes(page) == ["bare: no title on xaxis", "map: no title on colorbar0"]


# --- synthetic inputs ------------------------------------------------------------------------------


def _widget_figures(obj) -> list:
    """The FigureWidgets inside an ipywidgets panel (depth first)."""
    if isinstance(obj, go.FigureWidget):
        return [obj]
    return [f for child in getattr(obj, "children", ()) or () for f in _widget_figures(child)]


def _check_panel(panel, n_figures: int) -> None:
    figs = _widget_figures(panel)
    assert len(figs) == n_figures
    for fig in figs:
        assert untitled_axes(fig) == [], fig.layout.title.text


ROUTERS = ("jsq", "eldr", "domain_oracle")
RATES = (20.0, 40.0, 60.0)


def _rate_df() -> pd.DataFrame:
    return pd.DataFrame([{"router": r, "rate": x, "tpot_ms_p50": 30 + i + x / 10, "distinct_per_layer_step": 40 - i}
                         for i, r in enumerate(ROUTERS) for x in RATES])


def _paper_cmp(real: bool) -> pd.DataFrame:
    cmp = pd.DataFrame({"rate": RATES, "paper_gain_pct": [8.0, 10.0, 12.0], "tpot_gain_pct": [6.0, 9.0, 13.0],
                        "distinct_reduction_pct": [20.0, 22.0, 25.0]})
    cmp["ratio_synthetic"] = cmp["tpot_gain_pct"] / cmp["paper_gain_pct"]
    if real:
        cmp["real_tpot_gain_pct"] = [4.0, 5.0, 6.0]
        cmp["ratio_real"] = cmp["real_tpot_gain_pct"] / cmp["paper_gain_pct"]
    return cmp


def _regime_df() -> pd.DataFrame:
    return pd.DataFrame([{"n_workers": k, "tau": t, "rate": x, "rho": rho, "p50_gain_pct": rho * x / 10,
                          "p99_gain_pct": rho, "oracle_gap_pct": -rho}
                         for k in (8, 16) for t in (0.1, 0.2) for x in RATES for rho in (0.2, 0.5)])


def _report(err: float) -> SimpleNamespace:
    return SimpleNamespace(measured=np.array([1e-4, 2e-4]), predicted=np.array([1.1e-4, 1.9e-4]),
                           median_abs_err_pct=err)


# --- notebook 00 and 01 ----------------------------------------------------------------------------


def test_overview_figures():
    assert untitled_axes(overview.lab_map_figure()) == []
    table = pd.DataFrame([{"model": "olmoe-1b-7b", "B": 256, "method": "bmm_active", "D": d, "ms_per_layer": 0.01 * d}
                          for d in (8, 32, 64)])
    model = SimpleNamespace(method="bmm_active", predict_ms=lambda shape, B, D: 0.01 * np.asarray(D, float))
    assert untitled_axes(overview.moe_experts_figure(table, model, 256)) == []
    _check_panel(overview.moe_panel(table, model, 256), 1)


def test_eldr_figures():
    table = pd.DataFrame({"ms_per_layer": [1e-4, 2e-4]})
    figs = [
        eldr.fig_costmodel(SimpleNamespace(train_report=_report(2.0), test_report=_report(3.0)), table),
        eldr.fig_greedy_curve([0.2, 0.5, 0.4]),
        eldr.fig_rate_sweep(_rate_df()),
        eldr.fig_paper_comparison(_paper_cmp(real=False)),
        eldr.fig_paper_two_sided(_paper_cmp(real=False)),
        eldr.fig_paper_two_sided(_paper_cmp(real=True)),
        eldr.fig_regime_map(_regime_df(), n_workers=8, tau=0.1, paper_rho=(0.3, 0.4), real_point=(40.0, 0.5)),
        eldr.fig_ablation(_rate_df()[lambda d: d["rate"] == 40.0], "router", "ablation: router"),
    ]
    for fig in figs:
        assert untitled_axes(fig) == [], fig.layout.title.text


def test_eldr_panels():
    _check_panel(eldr.regime_panel(_regime_df()), 1)

    def run_one(setup, router, *, rate, tau, n_requests, output_len):
        return {"tpot_ms_p50": 30.0, "tpot_ms_p99": 45.0, "distinct_per_layer_step": 40.0}

    setups = {"qwen3": SimpleNamespace(n_workers=16)}
    panel = eldr.eldr_panel(setups, run_one, n_requests=10, output_len=8,
                            with_workers=lambda s, k: SimpleNamespace(n_workers=k), routers=("jsq", "eldr"))
    _check_panel(panel, 1)


# --- notebook 02 -----------------------------------------------------------------------------------


def _hd_result() -> SimpleNamespace:
    steps = [SimpleNamespace(accepted=[5, 6], sources=["W", "S"], bonus=7),
             SimpleNamespace(accepted=[], sources=[], bonus=8),
             SimpleNamespace(accepted=[9], sources=["L"], bonus=10)]
    return SimpleNamespace(steps=steps, tokens=list(range(7)), mean_accepted=1.0)


def _hd_summary() -> pd.DataFrame:
    from moelab.datasets import SPEC_BENCH_CATEGORIES

    rows = []
    for m in ("AR", "PLD", "HD(WSL)", "HD@4", "HD@8", "PLD@4", "PLD@8"):
        for c in [*SPEC_BENCH_CATEGORIES, "overall"]:
            row = {"method": m, "category": c, "mean_accepted": 1.5, "speedup": 1.2, "budget": 8}
            row.update({f"{s}_hit_rate": 0.4 for s in "WSL"} | {f"{s}_accept_share": 0.3 for s in "WSL"})
            rows.append(row)
    return pd.DataFrame(rows)


def test_hd_figures():
    summary = _hd_summary()
    compare = pd.DataFrame({"category": ["overall", "math"], "ours (vLLM engine)": [1.3, 1.5],
                            "published (PLD)": [1.4, 1.6]})
    figs = [
        hd.fig_steps(_hd_result()),
        hd.fig_verify_cost({"HF engine": pd.DataFrame({"q": [1, 2, 4], "ms_median": [10.0, 11.0, 13.0]})}),
        hd.fig_mat_by_budget(summary),
        hd.fig_speedup_by_category(summary),
        hd.fig_mat_by_category(summary),
        hd.fig_published(compare),
        hd.fig_store_shares(summary),
    ]
    for fig in figs:
        assert untitled_axes(fig) == [], fig.layout.title.text


def test_hd_panel():
    tokenizer = SimpleNamespace(decode=lambda ids: f"<{ids[0]}>")
    _check_panel(hd.drafting_panel(lambda c, n, order, t: _hd_result(), tokenizer), 1)


# --- notebook 03 -----------------------------------------------------------------------------------


def _afd_sweep() -> pd.DataFrame:
    r = np.array([1.0, 2.0, 4.0, 8.0])
    return pd.DataFrame({"r": r, "sim_throughput": 100 * r / (1 + r), "sim_attention_idle": 0.5 / r,
                         "sim_ffn_idle": 1 - 1 / r})


def test_afd_figures():
    ws = {"B": 256, "mu_P": 100.0, "mu_D": 500.0, "N": 10_000.0}
    table = pd.DataFrame([{"B": b, "mu_P": p, "mu_D": d, "r_star": 3.0, "binding": "balance"}
                          for b in (64, 256) for p in (100, 1000) for d in (100, 500)])
    frame = pd.DataFrame({"r": [1.0, 2.0, 4.0], "theory_throughput": [50.0, 66.0, 80.0],
                          "sim_throughput": [49.0, 67.0, 79.0]})
    frame["sim_vs_theory_pct"] = 100 * (frame["sim_throughput"] / frame["theory_throughput"] - 1)
    res = SimpleNamespace(frame=frame, r_star=2.5, r_sim=2.0, unit="ms", B=256, lengths="geometric", mu_P=100.0,
                          mu_D=500.0)
    gaps = pd.DataFrame([{"lengths": dist, "B": b, "mu_P": p, "mu_D": d, "gap_pct": 3.0}
                         for dist in ("geometric", "azure") for b in (64, 256) for p in (100, 1000) for d in (100, 500)])
    figs = [afd.throughput_figure(_afd_sweep(), **ws), afd.idle_figure(_afd_sweep(), **ws),
            afd.ratio_table_figure(table), afd.measured_figure(res), afd.gap_map_figure(gaps)]
    for fig in figs:
        assert untitled_axes(fig) == [], fig.layout.title.text


def test_afd_panel():
    _check_panel(afd.afd_panel(B=16, N=100, r_values=(1, 2)), 2)  # a tiny simulated sweep (100 requests)


# --- notebook 04 -----------------------------------------------------------------------------------


def test_dsd_figures():
    kw = {"gamma": 4, "t_ar": 50.0, "t_a": 10.0, "t_d": 10.0}
    mc = pd.DataFrame({"mode": ["ar", "dsd_sync"], "rtt": [50.0, 50.0], "latency": [50.0, 40.0], "ci": [1.0, 1.0]})
    breakeven = pd.DataFrame({0.6: [40.0, np.nan], 0.8: [90.0, 20.0]}, index=[50.0, 20.0])
    measured = pd.DataFrame({"gamma": [2, 4], "t_d_over_t_v": [0.1, 0.1], "measured_ratio": [1.2, 1.4]})
    tried, accepted = np.array([10, 8, 5]), np.array([8, 5, 3])  # rounds reaching / accepting draft token j
    trace = SimpleNamespace(gamma_max=3, drafter="pld", first_token_rate=lambda g=None: 0.8,
                            position_acceptance=lambda g=None: {"position": np.arange(1, 4), "tried": tried,
                                                                "accepted": accepted, "rate": accepted / tried})
    latency = pd.DataFrame([{"mode": m, "rtt": x, "closed_form": 40.0 + x / 10, "measured": 41.0 + x / 10}
                            for m in ("ar", "dsd_pipelined") for x in (10.0, 100.0)])
    figs = [
        dsd.latency_vs_rtt_figure(alpha=0.8, mc=mc, **kw),
        dsd.region_map_figure(n=11, **kw),
        dsd.breakeven_table_figure(breakeven, gamma=4, t_a=10.0),
        dsd.capacity_figure(measured=measured),
        dsd.conditional_acceptance_figure({"PLD": trace}),
        dsd.measured_latency_figure(latency),
    ]
    for fig in figs:
        assert untitled_axes(fig) == [], fig.layout.title.text


def test_dsd_panel():
    _check_panel(dsd.dsd_panel(), 3)


# --- notebook 05 -----------------------------------------------------------------------------------


def _br_results() -> dict:
    steps = pd.DataFrame({"t_s": np.arange(40) * 0.1, "imbalance": np.arange(40) % 7 * 10.0,
                          "decision_ms": np.full(40, 0.02)})
    return {"jsq": SimpleNamespace(steps=steps), "br0": SimpleNamespace(steps=steps)}


def _br_grid() -> pd.DataFrame:
    return pd.DataFrame([{"shape": s, "context_scale": c, "G": g, "slots": 32, "attention_share": 0.3 * c,
                          "brh_throughput_gain_pct": 2.0, "br0_throughput_gain_pct": 1.0,
                          "brh_imbalance_reduction_pct": 40.0, "br0_imbalance_reduction_pct": 30.0}
                         for s in ("qwen3-30b-a3b", "deepseek-v3") for c in (1.0, 2.0) for g in (4, 8)])


def test_balanceroute_figures():
    per_g = pd.DataFrame([{"router": r, "G": g, "throughput": 100.0 + g, "load": x}
                          for r in ("jsq", "br0") for g in (4, 8) for x in (0.8, 1.2)])
    figs = [
        balanceroute.imbalance_over_time(_br_results(), 8, smooth=5),
        balanceroute.bars(per_g[per_g["load"] == 0.8], "throughput", "throughput", "tokens/s"),
        balanceroute.decision_times(_br_results()),
        balanceroute.table(per_g, "numbers"),
        balanceroute.load_sweep(per_g[per_g["G"] == 8], "throughput", "load sweep", "tokens/s"),
        balanceroute.regime_heatmap(_br_grid(), 8, 32),
        balanceroute.gain_vs_share(_br_grid(), paper_gain_pct=5.0,
                                   highlight={"shape": "qwen3-30b-a3b", "context_scale": 1.0, "G": 8}),
    ]
    for fig in figs:
        assert untitled_axes(fig) == [], fig.layout.title.text


def test_balanceroute_panels():
    _check_panel(balanceroute.interactive_panel(lambda *a: _br_results(), G=8, slots=32, horizon=4, gamma=0.9,
                                                beta=None, load=1.0), 1)
    _check_panel(balanceroute.regime_panel(_br_grid(), G=8, slots=32), 1)


# --- notebook 06 -----------------------------------------------------------------------------------


def test_deployment_figures():
    rng = np.random.default_rng(0)
    sig = rng.random((6, 4))
    sig /= np.linalg.norm(sig, axis=1, keepdims=True)
    trace = SimpleNamespace(domain_codes=lambda: (np.array([0, 0, 1, 1, 2, 2]), ["code", "math", "chat"]),
                            prefill_counts=rng.integers(0, 5, size=(6, 2, 8)))
    distinct = {"jsq": 30.0, "eldr": 22.0}
    figs = [deployment.fig_signature_similarity(sig, ["code", "math", "chat"] * 2),
            deployment.fig_domain_experts(trace, 1), deployment.fig_distinct_experts(distinct, 4)]
    for fig in figs:
        assert untitled_axes(fig) == [], fig.layout.title.text
    # each domain's block is named once, at its centre (requests sorted by domain: chat 0-1, code 2-3, math 4-5)
    assert list(figs[0].layout.xaxis.ticktext) == ["chat", "code", "math"]
    assert list(figs[0].layout.yaxis.tickvals) == [0.5, 2.5, 4.5]
    _check_panel(deployment.tau_panel(lambda tau: 20.0, distinct, 4, 0.1), 1)


# --- notebook 07 -----------------------------------------------------------------------------------


def _pairs() -> pd.DataFrame:
    return pd.DataFrame([{"instance_router": i, "rank_router": r, "tpot_ms_p50_gain_pct": 3.0,
                          "tpot_ms_p99_gain_pct": 5.0, "distinct_per_layer_step": 30.0, "avg_imbalance": 100.0,
                          "rate": 12.0} for i in ("jsq", "eldr") for r in ("jsq", "br0")])


@pytest.mark.parametrize("widget", [False, True])
def test_cross_figures(widget):
    assert untitled_axes(cross.pairs_figure(_pairs(), widget=widget)) == []
    assert untitled_axes(cross.causes_figure(_pairs())) == []


def test_cross_panel():
    _check_panel(cross.panel(lambda **kw: _pairs(), K=2, G=2, load=1.0, tau=0.1, attention_share=0.3), 1)


def test_a_builder_that_loses_its_titles_is_caught():
    fig = cross.causes_figure(_pairs())
    fig.update_yaxes(title_text=None, row=1, col=2)
    assert untitled_axes(fig) == ["yaxis2"]

