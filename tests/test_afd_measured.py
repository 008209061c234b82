"""The independent AFD simulator: invariants of measured stages and real lengths, and its reduction to the
closed form when fed the closed form's own assumptions (the one place agreement is asserted)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import moelab.afd as afd
from moelab.afd.calibration import LinearStages, StageTables, fit_coefficients
from moelab.afd.measured import (
    MAX_B,
    MAX_R,
    LengthDistribution,
    _renewal_loads,
    gap_map,
    simulate_measured,
)
from moelab.afd.theory import expected_decode_load


@pytest.fixture(scope="module")
def stages():
    return StageTables.h200()


@pytest.fixture(scope="module")
def conv():
    return LengthDistribution.from_trace("azure-conv")


def test_attention_table_floor_points_and_extrapolation_flag(stages):
    rows = stages.attn_rows
    g = stages.geometry
    # at a measured point with a unique KV size the stage time is the table's (x layers)
    kv = rows.groupby("kv_bytes")["ms_attn_core"].median()
    tokens = kv.index.to_numpy() / g.kv_bytes_per_token
    assert np.allclose(stages.attention_ms(tokens), kv.to_numpy() * g.layers)
    # below the smallest measured KV the kernel floor holds
    assert stages.attention_ms(0.0) == pytest.approx(stages.attention_floor_ms)
    stages.reset_coverage()
    stages.attention_ms(tokens.max() * 3)
    cov = stages.reset_coverage()
    assert cov.attention_extrapolated == 1 and cov.any_extrapolated


def test_ffn_table_points_and_batch_extrapolation_flag(stages):
    m = stages.moe_rows
    row = m[(m["B"] == 128) & (m["D"] == 64)].iloc[0]
    assert stages.ffn_ms(128, 64) == pytest.approx(row["ms_per_layer"] * stages.geometry.layers)
    stages.reset_coverage()
    t = stages.ffn_ms(np.array([128.0, 256.0, 4096.0]))
    cov = stages.reset_coverage()
    assert cov.ffn_extrapolated == 1  # only 4096 lies above the measured batches
    assert np.all(np.diff(t) > 0)


def test_ffn_extrapolated_flags_what_the_counter_counts(stages):
    n = np.array([8.0, 128.0, 256.0, 257.0, 4096.0])
    flags = stages.ffn_extrapolated(n)
    assert flags.tolist() == [False, False, False, True, True]
    assert stages.ffn_table_max_batch == 256
    stages.reset_coverage()
    stages.ffn_ms(n)
    assert stages.reset_coverage().ffn_extrapolated == int(flags.sum())
    # asking counts nothing, and the theory's linear stages have no table to leave
    stages.ffn_extrapolated(n)
    assert stages.reset_coverage().ffn_evals == 0
    assert not LinearStages().ffn_extrapolated(n).any()


def test_ffn_extrapolated_is_the_rule_ffn_ms_counts_on_every_batch_and_expert_count(stages):
    """Review item: ffn_extrapolated and ffn_ms share one rule (the largest batch row covering D), element by
    element over a grid of (n, D), and it is vectorised (a per-element loop over the covering rows took seconds)."""
    n = np.array([1.0, 8.0, 40.0, 128.0, 256.0, 300.0, 5000.0])[:, None]
    D = np.array([8.0, 30.0, 64.0, 100.0, 128.0])[None, :]
    flags = stages.ffn_extrapolated(n, D)
    assert flags.shape == (7, 5)
    for i in range(7):
        for j in range(5):
            stages.reset_coverage()
            stages.ffn_ms(n[i, 0], D[0, j])
            assert stages.reset_coverage().ffn_extrapolated == int(flags[i, j]), (n[i, 0], D[0, j])
    assert flags[-2:].all() and not flags[:5].any()
    with pytest.raises(ValueError, match="fewer than two batch rows covering D=4.0"):
        stages.ffn_extrapolated(np.array([64.0, 64.0]), np.array([64.0, 4.0]))
    big = np.linspace(1.0, 8192.0, 200_000)
    start = time.perf_counter()
    assert stages.ffn_extrapolated(big).sum() == int((big > 256).sum())
    assert time.perf_counter() - start < 2.0


def test_fit_errors_count_points_beyond_the_tables(stages):
    fit = fit_coefficients(stages, B=256)
    err = fit.errors.set_index("stage")
    # r*B for r = 1..32 at B = 256: only r = 1 (256 tokens) is a measured batch
    assert err.loc["ffn", "points"] == 32 and err.loc["ffn", "points_beyond_table"] == 31
    assert err.loc["attention", "points_beyond_table"] == 0
    assert 0 < err.loc["link", "points_beyond_table"] <= err.loc["link", "points"]
    # where each largest error sits: a fitted point of that stage (03 says where the attention line misses most)
    g = stages.geometry
    kv = stages.attn_rows["kv_bytes"].to_numpy() / g.kv_bytes_per_token
    y = stages.attn_rows["ms_attn_core"].to_numpy() * g.layers
    worst = np.argmax(np.abs((fit.coeffs.a_A * kv + fit.coeffs.b_A) / y - 1))
    assert err.loc["attention", "max_err_at_tokens"] == kv[worst]
    assert 256 <= err.loc["ffn", "max_err_at_tokens"] <= 32 * 256


def test_link_extrapolated_matches_the_counters(stages):
    # DeepEP's per-call volumes (dispatch FP8, combine BF16) both lie within 2x of 2048 tokens of this hidden size
    tokens, r = np.array([2048.0, 2048.0, 128.0]), np.array([1, 15, 15])
    flags = stages.link_extrapolated(tokens, r)
    assert flags.tolist() == [True, False, True]  # EP 2 below the table; 128 tokens far below its volume
    stages.reset_coverage()
    stages.link_ms(tokens, r)
    cov = stages.reset_coverage()
    assert cov.link_ep_extrapolated == 1 and cov.link_volume_extrapolated >= 1
    # one rule: every (tokens, r) that link_ms counts outside the table is flagged, and no other
    grid_t, grid_r = np.meshgrid([64.0, 512.0, 2048.0, 8192.0, 40000.0], [1, 6, 7, 100, 255, 300])
    for t, rr in zip(grid_t.ravel(), grid_r.ravel()):
        stages.reset_coverage()
        stages.link_ms(t, rr)
        cov = stages.reset_coverage()
        counted = cov.link_ep_extrapolated + cov.link_volume_extrapolated
        assert bool(stages.link_extrapolated(t, rr)) == (counted > 0), (t, rr)
    assert not StageTables.h200(link=False).link_extrapolated(tokens, r).any()


def test_link_volume_counts_evaluations_not_transfers(stages):
    # 128 tokens lie more than 2x below both DeepEP volumes (dispatch and combine): one evaluation, counted once,
    # so the coverage table never reads "2 of 1 evaluations extrapolated"
    stages.reset_coverage()
    stages.link_ms(np.array([128.0, 2048.0]), np.array([15, 15]))
    cov = stages.reset_coverage()
    assert cov.link_evals == 2 and cov.link_volume_extrapolated == 1


def test_link_from_deepep_table(stages):
    t_af, t_fa = stages.link_ms(np.full(5, 256.0), np.array([1, 7, 15, 63, 255]))
    # more ranks share the network: the per-rank bandwidth in the table falls, the transfer slows
    assert np.all(np.diff(t_af) >= 0) and np.all(np.diff(t_fa) >= 0)
    # at a tabulated EP size (r=7 -> 8 ranks) a transfer is bytes / the table's bandwidth, every layer
    g = stages.geometry
    assert t_af[1] == pytest.approx(256 * g.hidden * 2 / 98e9 * 1e3 * g.layers)
    assert t_fa[1] == pytest.approx(256 * g.hidden * 2 / 127e9 * 1e3 * g.layers)
    cov = stages.reset_coverage()
    assert cov.link_ep_extrapolated == 1  # r=1 -> EP 2 is below the table's EP 8
    no_link = StageTables.h200(link=False)
    assert no_link.link_ms(256, 4)[0] == 0


def test_fit_reports_errors(stages):
    fit = fit_coefficients(stages, B=256, r_values=range(1, 33))
    assert set(fit.errors["stage"]) == {"attention", "ffn", "link"}
    assert fit.coeffs.unit == "ms" and fit.coeffs.a_F > 0
    assert np.all(np.isfinite(fit.errors[["median_abs_err_pct", "max_abs_err_pct"]].to_numpy()))


def test_renewal_loads_reduce_to_the_geometric_law():
    rng = np.random.default_rng(3)
    B, K, mu_D, groups = 64, 1500, 300.0, 200
    lengths = LengthDistribution.geometric(50.0, mu_D, prompt_cv=0.0)
    loads = np.stack([_renewal_loads(B, K, lengths, rng) for _ in range(groups)])
    k = np.array([1, 50, 300, 900, 1499])
    expected = B * 50 + expected_decode_load(k, B, mu_D)
    z = (loads[:, k].mean(axis=0) - expected) / (loads[:, k].std(axis=0) / np.sqrt(groups))
    assert loads[:, 0] == pytest.approx(B * 50)
    assert np.all(np.abs(z) < 4.5), z


def test_renewal_loads_reach_the_renewal_steady_state(conv):
    # long run, a slot holds the size-biased prompt plus the mean age (renewal theory), not mu_P + mu_D
    rng = np.random.default_rng(5)
    lengths = LengthDistribution.from_trace("azure-code")
    B, K = 128, 6000
    loads = np.stack([_renewal_loads(B, K, lengths, rng) for _ in range(8)])
    late = loads[:, K // 2:].mean() / B
    assert late == pytest.approx(lengths.steady_load_per_slot, rel=0.05)
    # heavy-tailed decode lengths hold slots longer than the geometric law with the same mean implies
    long = LengthDistribution.from_trace("azure-code", 4000, 1000)
    assert long.steady_load_per_slot / (long.mean_prompt + long.mean_decode) > 1.2


def test_steady_load_parts_split_the_load_into_prompt_and_decode(conv):
    # the parts sum to the steady load, and each is set against the mean the theory uses
    parts = conv.steady_load_parts()
    assert parts["prompt"] + parts["decode"] == pytest.approx(conv.steady_load_per_slot, rel=1e-12)
    assert parts["prompt_ratio"] == pytest.approx(parts["prompt"] / conv.mean_prompt)
    assert parts["decode_ratio"] == pytest.approx(parts["decode"] / conv.mean_decode)
    # the geometric law is the theory's own: both parts are its means, uncorrelated, decode CV about 1
    geo = LengthDistribution.geometric(1000, 300).steady_load_parts()
    assert (geo["prompt"], geo["decode"], geo["prompt_ratio"], geo["decode_ratio"]) == (1000, 300, 1, 1)
    assert geo["prompt_decode_corr"] == 0 and geo["decode_cv"] == pytest.approx(1, abs=0.01)
    # longer outputs with shorter prompts: a slot's prompt is below mu_P though both laws have the same means
    prompt, decode = np.array([100.0, 900.0]), np.array([90.0, 10.0])
    anti = LengthDistribution("pairs", prompt, decode).steady_load_parts()
    assert anti["prompt_decode_corr"] < 0 and anti["prompt_ratio"] == pytest.approx((100 * 90 + 900 * 10) / 100 / 500)
    # constant decode steps (lighter-tailed than geometric) hold less than mu_D on average: mean age (d-1)/2
    flat = LengthDistribution("flat", np.full(4, 50.0), np.full(4, 11.0)).steady_load_parts()
    assert flat["decode_ratio"] == pytest.approx(5 / 10) and flat["decode_cv"] == 0 and flat["prompt_decode_corr"] == 0


def test_conservation_bound_and_seed(stages, conv):
    a = simulate_measured([1, 2, 5], 32, conv, stages=stages, requests=200, seed=7)
    b = simulate_measured([1, 2, 5], 32, conv, stages=stages, requests=200, seed=7)
    c = simulate_measured([1, 2, 5], 32, conv, stages=stages, requests=200, seed=8)
    pd_equal = a.frame.equals(b.frame)
    assert pd_equal and a.coverage == b.coverage
    assert not a.frame["makespan"].equals(c.frame["makespan"])
    f = a.frame
    # every microbatch step of every instance emits B tokens
    assert np.all(f["tokens"] == a.steps * a.microbatches * f["r"] * 32)
    # the makespan is at least each stage's total work: throughput never beats the slowest stage's mean
    assert np.all(f["sim_throughput"] <= f["stage_bound_throughput"] * (1 + 1e-9))
    assert np.all((f["sim_attention_idle"] >= -1e-9) & (f["sim_ffn_idle"] >= -1e-9))
    assert a.fit is not None and a.unit == "ms"


def test_stragglers_grow_with_r(stages, conv):
    res = simulate_measured([1, 2, 4, 8], 16, conv, stages=stages, requests=100, seed=1)
    s = res.frame["sim_straggler_time"].to_numpy()
    assert np.all(np.diff(s) >= -1e-12)  # common random numbers: the max over more instances
    slow = simulate_measured([4], 16, conv, stages=stages, requests=100, seed=1, speed_cv=0.3)
    assert slow.frame["sim_straggler_time"].iloc[0] > res.frame["sim_straggler_time"].iloc[2]


def test_reduces_to_the_closed_form_on_its_own_assumptions():
    # linear stage times from the six coefficients + geometric lengths: the closed form's world
    coeffs = afd.AFDCoefficients.paper()
    lengths = LengthDistribution.geometric(100, 500, prompt_cv=0.0)
    res = simulate_measured(list(range(1, 25)), 256, lengths, stages=LinearStages(coeffs), requests=2000, seed=0)
    assert res.coeffs == coeffs
    f = res.frame
    ffn_bound = f["r"] >= res.r_star + 1
    assert np.all(np.abs(f.loc[ffn_bound, "sim_vs_theory_pct"]) < 0.5)
    assert abs(res.r_sim - res.r_star) <= 1.0
    assert res.coverage["attention_extrapolated"] == 0


def test_default_sweep_covers_r32_and_is_not_at_its_edge(stages, conv):
    res = afd.measured_optimum(256, conv, stages=stages, requests=300)
    assert 32 in res.frame["r"].to_numpy()
    assert not res.optimum_at_edge
    assert np.isfinite(res.throughput_gap_pct(32))
    with pytest.raises(ValueError, match="r must be one of"):
        res.throughput_gap_pct(10_000)


def test_gap_map_rows(stages):
    df = gap_map((64,), (100,), (50,), ("geometric", "azure-code"), requests=100, stages=stages)
    assert len(df) == 2 and set(df["lengths"]) == {"geometric", "azure-code"}
    assert np.allclose(df["gap_rel"] * 100, df["gap_pct"])
    # the regime is the load against the takeover load; 64 slots keep r*B measured up to r = 4
    assert ((df["token_load"] > df["takeover_load"]) == (df["binding"] == "attention")).all()
    assert (df["ffn_measured_share"] > 0).all() and (df["ffn_measured_share"] < 1).all()
    # a light load (this FFN-peak setting): the FFN step outlasts even the slowest instance at every r, no crossing
    assert (df["horizon_load_ratio"] > 0).all() and df["straggler_crossing"].isna().all()


def test_horizon_load_follows_the_lengths_shape(stages):
    # geometric lengths hold the closed form's Tbar; heavy-tailed azure-code lengths at the same means hold less over a
    # short horizon (most requests end early and reset their slots) and more over a long one (toward load_ratio > 1)
    geo = simulate_measured([1, 2, 4], 64, LengthDistribution.geometric(2000, 500), stages=stages, requests=128)
    assert geo.frame["sim_token_load"].iloc[-1] == pytest.approx(afd.mean_token_load(64, geo.mu_P, geo.mu_D, 128), rel=0.02)
    code = LengthDistribution.from_trace("azure-code", 2000, 500)
    assert code.steady_load_per_slot > 1.2 * (code.mean_prompt + code.mean_decode)
    short, long = (simulate_measured([1, 2], 64, code, stages=stages, requests=n) for n in (128, 1280))
    assert short.frame["sim_token_load"].iloc[-1] < 0.99 * afd.mean_token_load(64, short.mu_P, short.mu_D, 128)
    assert long.frame["sim_token_load"].iloc[-1] > 1.05 * afd.mean_token_load(64, long.mu_P, long.mu_D, 1280)


def test_sweep_flags_each_r_whose_ffn_batch_is_projected(stages, conv):
    res = simulate_measured([1, 2, 4], 128, conv, stages=stages, requests=200)
    assert res.frame["ffn_extrapolated"].tolist() == [False, False, True]  # 128, 256 measured; 512 is not
    # the sweep carries its own tables' largest measured batch (notebook 03 read a fresh h200()'s before)
    assert res.ffn_table_max_batch == stages.ffn_table_max_batch == 256
    moe = stages.moe_rows[stages.moe_rows["B"] <= 128]
    small = StageTables(stages.attn_rows, moe, None, stages.shape, stages.method)
    cut = simulate_measured([1, 2, 4], 64, conv, stages=small, requests=200)
    assert cut.ffn_table_max_batch == 128 and cut.frame["ffn_extrapolated"].tolist() == [False, False, True]
    assert simulate_measured([1, 2], 64, conv, stages=LinearStages(), requests=200).ffn_table_max_batch == float("inf")
    assert res.coverage["ffn_extrapolated"] == 1


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"r_values": [0]}, "r_values"), ({"r_values": [MAX_R + 1]}, "r_values"), ({"r_values": [1.5]}, "r_values"),
    ({"r_values": []}, "r_values"), ({"B": 0}, "B"), ({"B": MAX_B + 1}, "B"), ({"requests": 0}, "requests"),
    ({"requests": 1e12}, "requests"), ({"microbatches": 0}, "microbatches"), ({"microbatches": 99}, "microbatches"),
    ({"speed_cv": -1}, "speed_cv"), ({"lengths": 3}, "lengths"), ({"lengths": "sharegpt"}, "lengths must be"),
    ({"requests": 900_000, "r_values": [200]}, "MAX_"), ({"stages": "h200"}, "stages"), ({"seed": -1}, "seed"),
])
def test_bad_input_names_parameter(kwargs, name):
    args = {"r_values": [1, 2], "B": 8, "lengths": LengthDistribution.geometric(10, 10), "requests": 20, **kwargs}
    with pytest.raises(ValueError, match=name):
        simulate_measured(**args)


def test_gap_map_and_lengths_refuse_bad_input():
    with pytest.raises(ValueError, match="200 cells"):
        gap_map(tuple(range(1, 30)), (1, 2, 3), (1, 2, 3))
    with pytest.raises(ValueError, match="distributions"):
        gap_map((8,), (1,), (1,), ("uniform",))
    with pytest.raises(ValueError, match="mu_D"):
        LengthDistribution.geometric(10, float("inf"))
    with pytest.raises(ValueError, match="D"):
        StageTables.h200().ffn_ms(256, 1000)


def test_r_star_does_not_depend_on_the_r_values_asked():
    """The theory is fitted on a fixed design (FIT_R_VALUES), never on the r values asked to simulate."""
    from moelab.afd.measured import FIT_R_VALUES, measured_optimum, simulate_measured

    full = measured_optimum(256, requests=2000)
    for subset in ([8], [2, 3, 4], [1, 40]):
        part = simulate_measured(subset, 256, requests=2000)
        assert part.r_star == pytest.approx(full.r_star, rel=1e-12), subset
        assert part.coeffs == full.coeffs
    assert tuple(FIT_R_VALUES) == tuple(range(1, 33))


def test_one_fit_design_for_the_user_and_the_simulator():
    """coefficients_from_tables fits on the simulator's design (FIT_R_VALUES): the closed form a user computes
    equals the simulator's r_star at the same workload, also where lengths move r* (long contexts)."""
    from moelab.afd.calibration import FIT_R_VALUES as design
    from moelab.afd.measured import FIT_R_VALUES

    assert design is FIT_R_VALUES and afd.FIT_R_VALUES is FIT_R_VALUES
    import inspect

    assert inspect.signature(afd.coefficients_from_tables).parameters["r_values"].default is FIT_R_VALUES
    assert inspect.signature(afd.fit_coefficients).parameters["r_values"].default is FIT_R_VALUES
    coeffs = afd.coefficients_from_tables("h200", B=256)
    for mu_P, mu_D in ((1000, 300), (4000, 1000)):
        res = afd.simulate_measured([4], 256, LengthDistribution.geometric(mu_P, mu_D), requests=300)
        assert (res.mu_P, res.mu_D) == (mu_P, mu_D)  # the geometric law's means are exact
        assert res.coeffs.as_dict() | {"source": ""} == coeffs.as_dict() | {"source": ""}
        assert res.r_star == pytest.approx(afd.optimal_ratio(256, mu_P, mu_D, N=300, coeffs=coeffs), rel=1e-12)


@pytest.mark.parametrize("fn", ["measured_optimum", "simulate_measured"])
def test_mean_lengths_as_keywords_are_refused_by_name_saying_what_to_pass(fn):
    call = getattr(afd, fn)
    args = () if fn == "measured_optimum" else ([4],)
    with pytest.raises(TypeError) as err:
        call(*args, mu_P=1000, mu_D=300)
    msg = str(err.value)
    assert msg.startswith(f"{fn}() takes no mu_P or mu_D")
    assert "lengths=LengthDistribution.geometric(mu_P=1000, mu_D=300)" in msg and "from_trace('azure-conv'" in msg
    assert "simulate_measured" not in msg or fn == "simulate_measured"
    with pytest.raises(TypeError, match=rf"{fn}\(\) got an unexpected keyword argument 'bogus'"):
        call(*args, bogus=1)
    with pytest.raises(ValueError, match=r"lengths must be .*LengthDistribution.geometric\(mu_P, mu_D\)"):
        call(*args, lengths="geometric")
