"""DSD limits: the spec's break-even table, closed forms vs Monte-Carlo, multi-client capacity."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

import moelab.dsd as dsd
from moelab.dsd.montecarlo import accepted_lengths

# the spec's check table (gamma=5, t_a=10 ms): RTT_max in ms, None = blank (DSD never beats AR)
SPEC_TABLE = {
    100: {0.5: 47, 0.7: 144, 0.85: 265, 0.9: 319},
    50: {0.5: None, 0.7: 47, 0.85: 108, 0.9: 134},
    30: {0.5: None, 0.7: 8, 0.85: 45, 0.9: 61},
    20: {0.5: None, 0.7: None, 0.85: 13, 0.9: 24},
}


def test_breakeven_table_exact():
    table = dsd.breakeven_table(alphas=(0.5, 0.7, 0.85, 0.9), t_ars=(100, 50, 30, 20), gamma=5, t_a=10)
    for t_ar, row in SPEC_TABLE.items():
        for alpha, expected in row.items():
            got = table.loc[t_ar, f"{alpha:g}"]
            if expected is None:
                assert math.isnan(got), (t_ar, alpha, got)
                assert dsd.rtt_breakeven(alpha, 5, t_ar, 10) < 0
            else:
                assert got == expected, (t_ar, alpha, got)


def test_breakeven_is_where_sync_dsd_ties_ar():
    rtt = dsd.rtt_breakeven(0.85, 5, 50, 10)
    at = dsd.latency_per_token("dsd_sync", alpha=0.85, gamma=5, t_ar=50, t_a=10, rtt=rtt)
    assert at == pytest.approx(50)
    assert dsd.latency_per_token("dsd_sync", alpha=0.85, gamma=5, t_ar=50, t_a=10, rtt=rtt - 1) < 50
    assert dsd.latency_per_token("dsd_sync", alpha=0.85, gamma=5, t_ar=50, t_a=10, rtt=rtt + 1) > 50


@pytest.mark.parametrize("gamma", [1, 4, 8])
@pytest.mark.parametrize("t_a", [0.0, 2.0, 5.0, 12.0])
def test_pipelined_breakeven_is_where_best_mode_switches_from_pipelined_to_ar(gamma, t_a):
    # on a grid of (alpha, RTT): pipelined DSD wins below the break-even, AR at and above it; NaN: AR everywhere
    alphas = np.linspace(0.0, 0.95, 20)
    t_ar = 30.0
    be = dsd.pipelined_breakeven(alphas, gamma, t_ar, t_a)
    assert be.shape == alphas.shape
    sync = np.asarray(dsd.rtt_breakeven(alphas, gamma, t_ar, t_a))
    wins = ~np.isnan(be)
    assert np.array_equal(wins, sync > 0)
    assert np.allclose(be[wins], (dsd.pipelined_window(gamma, t_a) + sync)[wins])
    modes = ("ar", "dsd_pipelined")
    for a, b in zip(alphas, be):
        rtts = np.linspace(0.0, 200.0, 401)
        best = dsd.best_mode(alpha=a, rtt=rtts, gamma=gamma, t_ar=t_ar, t_a=t_a, modes=modes)
        if np.isnan(b):
            assert (best == 0).all(), a
        else:
            assert (best[rtts < b - 1e-9] == 1).all() and (best[rtts > b + 1e-9] == 0).all(), (a, b)
    assert isinstance(dsd.pipelined_breakeven(0.8, gamma, t_ar, 1.0), float)


def test_best_mode_without_t_d_says_the_default_modes_include_colocated():
    with pytest.raises(ValueError, match=r"t_d is required when modes include 'colocated'.*cloud server.*modes=\('ar', "
                                         r"'dsd_sync', 'dsd_pipelined'\)"):
        dsd.best_mode(alpha=0.8, rtt=10, gamma=4, t_ar=30, t_a=5)
    assert dsd.best_mode(alpha=0.8, rtt=10, gamma=4, t_ar=30, t_a=5, modes=("ar", "dsd_sync")) == 1
    with pytest.raises(ValueError, match="t_d is required for mode 'colocated'"):
        dsd.latency_per_token("colocated", alpha=0.5, gamma=3, t_v=1)


def test_expected_tokens_edges():
    assert dsd.expected_tokens(0.0, 5) == 1.0
    assert dsd.expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert dsd.expected_tokens(0.999999, 4) == pytest.approx(5, rel=1e-4)


def test_capacity_gain_spec_example():
    assert dsd.capacity_gain(5, 10, 50) == pytest.approx(2.0)


def test_optimal_gamma_maximises_speedup():
    g = dsd.optimal_gamma(0.8, 0.05, 30)
    s = [dsd.leviathan_speedup(0.8, k, 0.05) for k in range(1, 31)]
    assert s[g - 1] == max(s) and 1 < g < 30


def test_colocated_beats_sync_when_server_can_host_both():
    rtt = np.linspace(0.1, 300, 50)
    alpha = np.linspace(0, 0.95, 20)[:, None]
    col = dsd.latency_per_token("colocated", alpha=alpha, gamma=5, t_d=10, t_v=50)
    sync = dsd.latency_per_token("dsd_sync", alpha=alpha, gamma=5, t_a=10, t_v=50, rtt=rtt)
    assert np.all(col < sync)


def test_pipelined_matches_colocated_only_inside_window():
    kw = {"alpha": 0.8, "gamma": 5, "t_a": 10, "t_v": 50}
    window = dsd.pipelined_window(5, 10)
    col = dsd.latency_per_token("colocated", alpha=0.8, gamma=5, t_d=10, t_v=50)
    assert dsd.latency_per_token("dsd_pipelined", rtt=window * 0.5, **kw) == pytest.approx(col)
    assert dsd.latency_per_token("dsd_pipelined", rtt=window * 1.5, **kw) > col
    modes = dsd.best_mode(alpha=0.8, rtt=np.array([10.0, 100.0]), gamma=5, t_ar=50, t_a=10, t_d=10)
    assert [dsd.MODES[i] for i in modes] == ["colocated", "colocated"]
    no_col = ("ar", "dsd_sync", "dsd_pipelined")
    modes = dsd.best_mode(alpha=np.array([0.9, 0.9, 0.1]), rtt=np.array([10.0, 400.0, 10.0]), gamma=5, t_ar=50,
                          t_a=10, modes=no_col)
    assert [no_col[i] for i in modes] == ["dsd_pipelined", "ar", "ar"]


@pytest.mark.parametrize("mode", dsd.MODES)
@pytest.mark.parametrize(("alpha", "rtt", "jitter"), [(0.6, 20.0, 0.0), (0.85, 45.0, 0.5), (0.9, 150.0, 0.3)])
def test_monte_carlo_agrees_with_closed_form(mode, alpha, rtt, jitter):
    res = dsd.simulate_rounds(mode, alpha=alpha, gamma=5, t_ar=50, t_d=8, t_a=10, rtt=rtt, rtt_jitter=jitter,
                              rounds=20_000, seed=11)
    lo, hi = res.ci(3.29)  # 99.9% interval
    assert lo <= res.closed_form <= hi, (res.latency_per_token, res.closed_form, res.z)
    if mode != "ar":
        E = dsd.expected_tokens(alpha, 5)
        assert abs(res.tokens_per_round - E) <= 3.29 * res.tokens_per_round_se


def test_truncated_geometric_law():
    rng = np.random.default_rng(0)
    a = accepted_lengths(0.7, 4, 200_000, rng)
    law = np.array([0.7**k * 0.3 for k in range(4)] + [0.7**4])
    freq = np.bincount(a, minlength=5) / a.size
    assert np.allclose(freq, law, atol=4e-3)


def test_monte_carlo_reproducible():
    a = dsd.simulate_rounds("dsd_sync", alpha=0.7, gamma=4, t_a=10, t_v=40, rtt=50, rtt_jitter=0.2, rounds=500, seed=3)
    b = dsd.simulate_rounds("dsd_sync", alpha=0.7, gamma=4, t_a=10, t_v=40, rtt=50, rtt_jitter=0.2, rounds=500, seed=3)
    assert a == b


def test_monte_carlo_reports_the_round_trips_it_drew():
    """Review item: notebook 04 said a deviation 'comes from the round trips drawn' without measuring them; the
    run now reports their mean and its standard error."""
    res = dsd.simulate_rounds("dsd_sync", alpha=0.7, gamma=4, t_a=10, t_v=40, rtt=50, rtt_jitter=0.2, rounds=4000,
                              seed=3)
    # a sync round is draft + RTT + verify, so the mean RTT drawn is the round's mean time less the fixed parts
    assert res.rtt == 50.0
    assert res.rtt_per_round == pytest.approx(res.latency_per_token * res.tokens_per_round - 4 * 10 - 40)
    assert res.rtt_per_round_se == pytest.approx(50 * 0.2 / np.sqrt(3) / np.sqrt(4000), rel=0.05)  # uniform law
    assert res.rtt_z == pytest.approx((res.rtt_per_round - 50) / res.rtt_per_round_se)
    assert abs(res.rtt_z) < 4
    fixed = dsd.simulate_rounds("dsd_sync", alpha=0.7, gamma=4, t_a=10, t_v=40, rtt=50, rounds=100, seed=3)
    colocated = dsd.simulate_rounds("colocated", alpha=0.7, gamma=4, t_d=5, t_v=40, rounds=100, seed=3)
    assert fixed.rtt_per_round == 50.0 and np.isnan(fixed.rtt_z) and np.isnan(colocated.rtt_z)


@pytest.mark.parametrize(("gamma", "t_d", "t_v"), [(5, 10, 50), (4, 5, 40)])
def test_multi_client_capacity_ratio(gamma, t_d, t_v):
    # reduction: this server is built on the proposition's own assumptions (one client per server job,
    # constant costs, i.i.d. acceptance), so agreement is expected; the measured, batching server is in
    # tests/test_dsd_measured.py and asserts invariants only
    cmp = dsd.capacity_ratio(alpha=0.8, gamma=gamma, t_d=t_d, t_v=t_v, t_a=t_d, rtt=60, rtt_jitter=0.3, seed=0)
    assert cmp.predicted_ratio == pytest.approx(1 + gamma * t_d / t_v)
    assert cmp.measured_ratio == pytest.approx(cmp.predicted_ratio, rel=0.05)
    assert cmp.dsd.max_clients > cmp.colocated.max_clients


def test_server_unloaded_rate_matches_single_client_latency():
    res = dsd.serve("dsd", 1, alpha=0.8, gamma=5, t_d=10, t_v=50, t_a=10, rtt=50, rounds_per_client=2000, seed=1)
    latency = dsd.latency_per_token("dsd_sync", alpha=0.8, gamma=5, t_a=10, t_v=50, rtt=50)
    assert res.per_client_rate == pytest.approx(1 / latency, rel=0.03)


@pytest.mark.parametrize(("call", "name"), [
    (lambda: dsd.expected_tokens(1.0, 5), "alpha"),
    (lambda: dsd.expected_tokens(-0.1, 5), "alpha"),
    (lambda: dsd.expected_tokens(np.array([0.5, 1.2]), 5), "alpha"),
    (lambda: dsd.expected_tokens(0.5, 0), "gamma"),
    (lambda: dsd.expected_tokens(0.5, 2.5), "gamma"),
    (lambda: dsd.latency_per_token("cloud", t_ar=1), "mode"),
    (lambda: dsd.latency_per_token("ar", t_ar=-1), "t_ar"),
    (lambda: dsd.latency_per_token("dsd_sync", alpha=0.5, gamma=3, t_a=1, t_v=1, rtt=-5), "rtt"),
    (lambda: dsd.latency_per_token("dsd_sync", alpha=0.5, gamma=3, t_a=1, t_v=1), "rtt"),
    (lambda: dsd.latency_per_token("colocated", alpha=0.5, gamma=3, t_v=1), "t_d"),
    (lambda: dsd.latency_per_token("dsd_pipelined", alpha=0.5, gamma=3, t_a=1, t_v=1, rtt=1, rtt_jitter=2), "rtt_jitter"),
    (lambda: dsd.rtt_breakeven(0.5, 5, -1, 10), "t_ar"),
    (lambda: dsd.rtt_breakeven(0.5, 5, 10, float("nan")), "t_a"),
    (lambda: dsd.pipelined_breakeven(0.5, 5, -1, 10), "t_ar"),
    (lambda: dsd.pipelined_breakeven(1.0, 5, 10, 1), "alpha"),
    (lambda: dsd.pipelined_breakeven(0.5, 0, 10, 1), "gamma"),
    (lambda: dsd.capacity_gain(5, 10, 0), "t_v"),
    (lambda: dsd.capacity_gain(0, 10, 5), "gamma"),
    (lambda: dsd.simulate_rounds("ar", t_ar=1, rounds=1), "rounds"),
    (lambda: dsd.simulate_rounds("ar", t_ar=1, rounds=10**9), "rounds"),
    (lambda: dsd.serve("dsd", 10**6, alpha=0.5, gamma=2, t_d=1, t_v=1), "clients"),
    (lambda: dsd.serve("dsd", 2, alpha=0.5, gamma=2, t_d=1, t_v=1, rounds_per_client=10**9), "rounds_per_client"),
    (lambda: dsd.max_clients("dsd", 0.01, alpha=0.5, gamma=2, t_d=1, t_v=1, max_c=10**6), "max_c"),
    (lambda: dsd.optimal_gamma(0.5, 0.1, 10**6), "gamma_max"),
    (lambda: dsd.serve("dsd", 0, alpha=0.5, gamma=2, t_d=1, t_v=1), "clients"),
    (lambda: dsd.serve("dsd_sync", 1, alpha=0.5, gamma=2, t_d=1, t_v=1), "mode"),
    (lambda: dsd.max_clients("dsd", 1e6, alpha=0.5, gamma=2, t_d=1, t_v=1), "target_rate"),
    (lambda: dsd.best_mode(alpha=0.5, rtt=1, gamma=2, t_ar=1, t_a=1, modes=("ar", "edge")), "modes"),
])
def test_bad_input_names_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


@settings(max_examples=80, deadline=None)
@given(alpha=st.floats(0, 0.99), gamma=st.integers(1, 40))
def test_expected_tokens_bounds_and_monotone(alpha, gamma):
    E = dsd.expected_tokens(alpha, gamma)
    assert 1 - 1e-12 <= E <= min(gamma + 1, 1 / (1 - alpha)) + 1e-9
    assert dsd.expected_tokens(alpha, gamma + 1) >= E - 1e-12
    assert dsd.expected_tokens(min(alpha + 0.005, 0.995), gamma) >= E - 1e-12


@settings(max_examples=40, deadline=None)
@given(alpha=st.floats(0, 0.95))
def test_expected_tokens_limit(alpha):
    assert dsd.expected_tokens(alpha, 2000) == pytest.approx(1 / (1 - alpha), rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(alpha=st.floats(0, 0.98), gamma=st.integers(1, 12), t_ar=st.floats(1, 200), t_a=st.floats(0, 50),
       rtt=st.floats(0, 500), d=st.floats(0.1, 100))
def test_latency_monotone_in_rtt_and_breakeven_consistent(alpha, gamma, t_ar, t_a, rtt, d):
    kw = {"alpha": alpha, "gamma": gamma, "t_ar": t_ar, "t_a": t_a}
    for mode in ("dsd_sync", "dsd_pipelined"):
        assert dsd.latency_per_token(mode, rtt=rtt + d, **kw) >= dsd.latency_per_token(mode, rtt=rtt, **kw) - 1e-9
    # pipelining never hurts
    assert dsd.latency_per_token("dsd_pipelined", rtt=rtt, **kw) <= dsd.latency_per_token("dsd_sync", rtt=rtt, **kw) + 1e-9
    be = dsd.rtt_breakeven(alpha, gamma, t_ar, t_a)
    beats = dsd.latency_per_token("dsd_sync", rtt=rtt, **kw) < t_ar
    if abs(rtt - be) > 1e-6 * max(1.0, abs(be)):
        assert beats == (rtt < be)
    # more acceptance only helps: break-even grows with alpha
    assert dsd.rtt_breakeven(min(alpha + 0.01, 0.99), gamma, t_ar, t_a) >= be - 1e-9


@settings(max_examples=40, deadline=None)
@given(gamma=st.integers(1, 16), t_d=st.floats(0, 100), t_v=st.floats(0.1, 200))
def test_capacity_gain_at_least_one_and_linear(gamma, t_d, t_v):
    g = dsd.capacity_gain(gamma, t_d, t_v)
    assert g >= 1
    assert dsd.capacity_gain(gamma, 2 * t_d, t_v) - 1 == pytest.approx(2 * (g - 1), abs=1e-9)


def test_public_functions_document_every_parameter_with_its_unit():
    """help() on any public DSD function defines each of its parameters (t_a, t_d, t_v, ... with ms), and says
    what it returns: a user needs no source to call them."""
    import inspect
    import re

    import moelab.dsd as dsd

    for name in dsd.__all__:
        obj = getattr(dsd, name)
        if not inspect.isfunction(obj):
            continue
        doc = inspect.getdoc(obj) or ""
        assert "Parameters\n----------" in doc or not inspect.signature(obj).parameters, name
        assert "Returns\n-------" in doc, name
        documented = set()
        for line in doc.split("Parameters\n----------", 1)[-1].splitlines():
            m = re.match(r"^([\w, *]+?)\s*(:|$)", line)
            if m and not line.startswith(" "):
                documented |= {p.strip().lstrip("*") for p in m.group(1).split(",")}
        for p in inspect.signature(obj).parameters:
            assert p in documented, f"{name}: parameter {p!r} is not in its docstring"
    for t in ("t_a", "t_d", "t_v", "t_ar", "rtt"):  # the times the guide's example passes, each with its unit
        assert re.search(rf"^{t} : .*\n\s+.*\bms\b", inspect.getdoc(dsd.best_mode), re.M), t
    assert "end of the pipelined protocol's window" in inspect.getdoc(dsd.pipelined_window)


def test_round_table_by_hand():
    # alpha 0.5, gamma 2: E = (1 - 0.5^3) / (1 - 0.5) = 1.75 tokens per round
    t = dsd.round_table(alpha=0.5, gamma=2, rtt=50.0, t_ar=30.0, t_d=3.0, t_v=30.0, t_a=10.0)
    assert list(t.index) == list(dsd.MODES)
    assert t.loc["ar"].tolist() == [30.0, 1.0, 30.0]
    assert t.loc["colocated", "time per round (ms)"] == 2 * 3.0 + 30.0
    assert t.loc["dsd_sync", "time per round (ms)"] == 2 * 10.0 + 50.0 + 30.0
    assert t.loc["dsd_pipelined", "time per round (ms)"] == max(2 * 10.0, 50.0) + 30.0
    assert (t.loc[["colocated", "dsd_sync", "dsd_pipelined"], "tokens per round"] == 1.75).all()
    assert t.loc["dsd_sync", "ms per output token"] == pytest.approx(100.0 / 1.75)
    for mode in dsd.MODES:  # the per-mode closed form, written separately, agrees
        assert t.loc[mode, "ms per output token"] == pytest.approx(dsd.latency_per_token(
            mode, alpha=0.5, gamma=2, t_ar=30.0, t_d=3.0, t_v=30.0, t_a=10.0, rtt=50.0))
    with pytest.raises(ValueError, match="rtt"):
        dsd.round_table(alpha=0.5, gamma=2, rtt=-1.0, t_ar=30.0, t_d=3.0, t_v=30.0, t_a=10.0)
    with pytest.raises(ValueError, match="gamma"):
        dsd.round_table(alpha=0.5, gamma=0, rtt=5.0, t_ar=30.0, t_d=3.0, t_v=30.0, t_a=10.0)


def test_family_agreement_counts_the_points():
    # one point: the ordinary two-sided test
    one = dsd.family_agreement([1.0])
    assert one.points == 1 and one.z_threshold == pytest.approx(1.959964, abs=1e-5)
    assert one.p_max == pytest.approx(2 * norm.sf(1.0))
    # the same largest |z| is likelier among more points (Sidak), so the threshold grows with them
    few, many = dsd.family_agreement([2.87] + [0.1] * 6), dsd.family_agreement([2.87] + [0.1] * 20)
    assert few.p_max == pytest.approx(1 - (1 - 2 * norm.sf(2.87)) ** 7)
    assert few.p_max < 0.05 < many.p_max and not few.agrees and many.agrees
    assert few.z_threshold < 2.87 < many.z_threshold
    # the threshold is where p_max equals the level
    assert dsd.family_agreement([many.z_threshold] + [0.0] * 20).p_max == pytest.approx(0.05)
    # NaN marks a point without randomness (a zero standard error): it is not counted
    assert dsd.family_agreement([np.nan, -2.0, 0.5]).points == 2
    # a simulator that agrees: the family test passes at about 1 - level over many seeds
    rng = np.random.default_rng(0)
    passes = np.mean([dsd.family_agreement(rng.normal(size=21)).agrees for _ in range(2000)])
    assert 0.93 <= passes <= 0.97


@pytest.mark.parametrize(("z", "level", "name"), [([], 0.05, "z"), ([np.nan], 0.05, "z"), (["a"], 0.05, "z"),
                                                   ([np.inf], 0.05, "z"), ([1.0], 0.7, "level")])
def test_family_agreement_bad_input_names_parameter(z, level, name):
    with pytest.raises(ValueError, match=name):
        dsd.family_agreement(z, level=level)


def test_latency_figure_draws_the_closed_form_each_cross_is_scored_against():
    """Each drawn curve passes through the closed form the Monte-Carlo z is computed against (jitter included):
    a cross's distance from its curve is its z, not an offset from a jitter-free line."""
    from moelab.viz.dsd import latency_vs_rtt_figure  # lazy: plotly only for this check

    kw = {"alpha": 0.8, "gamma": 5, "t_ar": 50.0, "t_d": 8.0, "t_v": 50.0, "t_a": 10.0}
    jitter = 0.3
    fig = latency_vs_rtt_figure(rtt_max=300.0, rtt_jitter=jitter, **kw)
    curves = {trace.legendgroup: trace for trace in fig.data}
    for mode in dsd.MODES:
        for rtt in (0.0, 40.0, 50.0, 60.0, 150.0):
            scored = dsd.simulate_rounds(mode, rtt=rtt, rtt_jitter=jitter, rounds=50, seed=1, **kw).closed_form
            drawn = float(np.interp(rtt, curves[mode].x, curves[mode].y))
            assert drawn == pytest.approx(scored, rel=1e-9), (mode, rtt)
    # the jitter matters where the round trip straddles the drafting window: a jitter-free line would sit below
    plain = latency_vs_rtt_figure(rtt_max=300.0, **kw)
    pipelined = {f.legendgroup: f for f in plain.data}["dsd_pipelined"]
    assert float(np.interp(50.0, pipelined.x, pipelined.y)) < float(np.interp(50.0, curves["dsd_pipelined"].x,
                                                                             curves["dsd_pipelined"].y))
