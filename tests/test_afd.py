"""AFD sizing: the paper's check values, the closed form's internal consistency, the simulator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import moelab.afd as afd
from moelab.afd.sim import _slot_loads, idle_crossing, simulate, simulated_optimum, straggler_crossing, sweep
from moelab.afd.theory import expected_decode_load, mean_token_load, ratio_terms

# (B, mu_P, mu_D) -> r* at N = 10,000, from the spec (the paper's check values)
CHECK_VALUES = [((256, 100, 500), 9.3), ((128, 100, 500), 7.08), ((512, 100, 500), 10.3),
                ((256, 100, 100), 2.17), ((256, 500, 500), 17.25)]


@pytest.mark.parametrize(("args", "expected"), CHECK_VALUES)
def test_check_values(args, expected):
    assert afd.optimal_ratio(*args, N=10_000) == pytest.approx(expected, abs=0.1)


def test_mu_D_100_is_peak_bound():
    terms = ratio_terms(256, 100, 100, 10_000)
    assert terms.binding == "ffn_peak"
    assert terms.r_star == pytest.approx(np.sqrt(100 / (0.083 * 256)))


def test_infinite_horizon_limit():
    assert mean_token_load(256, 100, 500) == 256 * 600
    assert afd.optimal_ratio(256, 100, 500, N=1e9) == pytest.approx(afd.optimal_ratio(256, 100, 500), rel=1e-5)
    # a short horizon holds the slots in the filling transient: less load, fewer attention instances
    assert afd.optimal_ratio(256, 100, 500, N=500) < afd.optimal_ratio(256, 100, 500, N=10_000)


def test_throughput_curve_peaks_at_r_star():
    for args in [a for a, _ in CHECK_VALUES]:
        r = np.linspace(0.2, 40, 40_000)
        f = afd.throughput_per_instance(r, *args, N=10_000)
        assert r[f.argmax()] == pytest.approx(afd.optimal_ratio(*args, N=10_000), abs=0.01)


def test_stage_times_name_the_cycle_t_cyc_and_throughput_is_rB_over_r_plus_1_t_cyc():
    # NOTATION.md's symbol for the cycle time (the paper's tau is ELDR's band in this lab)
    r = np.array([1.0, 4.0, 16.0])
    st = afd.stage_times(r, 256, 100, 500, N=10_000)
    assert set(st) == {"t_A", "t_C", "t_F", "t_cyc"}
    assert np.allclose(st["t_cyc"], np.maximum(np.maximum(st["t_A"], st["t_C"]), st["t_F"]))
    assert np.allclose(afd.throughput_per_instance(r, 256, 100, 500, N=10_000), r * 256 / ((r + 1) * st["t_cyc"]))


def test_h200_r_star_is_the_ffn_peak_independent_of_lengths_and_horizon():
    # what optimal_ratio's docstring and the guide say: on the H200 fit r* is often r_peak = sqrt(b_F/(a_F B))
    c = afd.coefficients_from_tables("h200", B=256)
    peak = np.sqrt(c.b_F / (c.a_F * 256))
    for mu_P, mu_D, N in ((100, 100, 2000), (1000, 300, 2000), (1000, 1000, 1e6)):
        terms = ratio_terms(256, mu_P, mu_D, N, c)
        assert terms.binding == "ffn_peak" and terms.r_peak == pytest.approx(peak)
        assert afd.optimal_ratio(256, mu_P, mu_D, N, c) == pytest.approx(peak)
    assert ratio_terms(256, 4000, 1000, 2000, c).binding == "attention"  # long contexts: attention binds


def test_theory_idle_curves_cross_at_r_A():
    r = np.linspace(1, 32, 3101)
    idle = afd.idle_ratios(r, 256, 100, 500, N=10_000)
    cross = r[np.argmin(np.abs(idle["attention"] - idle["ffn"]))]
    assert cross == pytest.approx(ratio_terms(256, 100, 500, 10_000).r_A, abs=0.02)


def test_scalar_and_array_throughput():
    assert isinstance(afd.throughput_per_instance(4, 256, 100, 500), float)
    assert afd.throughput_per_instance(np.array([1.0, 2.0]), 256, 100, 500).shape == (2,)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"B": 0}, "B"), ({"B": 2.5}, "B"), ({"mu_P": -1}, "mu_P"), ({"mu_D": -0.5}, "mu_D"),
    ({"N": 0}, "N"), ({"N": 100}, "N"), ({"N": float("nan")}, "N"), ({"coeffs": "paper"}, "coeffs"),
])
def test_optimal_ratio_rejects_bad_input(kwargs, name):
    args = {"B": 256, "mu_P": 100, "mu_D": 500, "N": 10_000, **kwargs}
    with pytest.raises(ValueError, match=name):
        afd.optimal_ratio(**args)


@pytest.mark.parametrize("r", [0, -1, float("inf"), [1.0, 0.0]])
def test_throughput_rejects_bad_r(r):
    with pytest.raises(ValueError, match="r must be > 0"):
        afd.throughput_per_instance(r, 256, 100, 500)


@pytest.mark.parametrize(("field", "value"), [("a_F", 0.0), ("a_A", -1e-3), ("b_F", float("inf")), ("a_C", -1)])
def test_coefficients_reject_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        afd.AFDCoefficients.paper().replace(**{field: value})


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"r": 0}, "r"), ({"B": 0}, "B"), ({"microbatches": 0}, "microbatches"), ({"prompt_cv": -0.1}, "prompt_cv"),
    ({"speed_cv": -1}, "speed_cv"), ({"steps": 0}, "steps"), ({"requests": -5}, "requests"),
    ({"steps": 10, "requests": 10}, "steps or requests"), ({"prompt_lengths": np.array([])}, "prompt_lengths"),
    ({"seed": -1}, "seed"), ({"r": 10**6}, "r"), ({"B": 10**7}, "B"), ({"steps": 10**9}, "steps"),
    ({"microbatches": 1000}, "microbatches"), ({"r": 256, "steps": 100_000}, "MAX_CELLS"),
])
def test_simulate_rejects_bad_input(kwargs, name):
    args = {"r": 2, "B": 8, "mu_P": 10, "mu_D": 20, "steps": 50, **kwargs}
    if "requests" in kwargs and "steps" not in kwargs:
        args.pop("steps")
    with pytest.raises(ValueError, match=name):
        simulate(**args)


def test_slot_load_dynamics_match_expected_decode_load():
    rng = np.random.default_rng(3)
    B, K, mu_D, groups = 64, 1500, 300.0, 300
    loads = _slot_loads(groups, B, K, 1 / (1 + mu_D), lambda g, n: np.full(n, 50.0), rng)
    k = np.array([0, 1, 50, 300, 900, 1499])
    expected = B * 50 + expected_decode_load(k, B, mu_D)
    se = loads[:, k].std(axis=0) / np.sqrt(groups) + 1e-9
    z = (loads[:, k].mean(axis=0) - expected) / se
    assert loads[:, 0] == pytest.approx(B * 50)
    assert np.all(np.abs(z[1:]) < 4.5), z


def test_simulation_is_reproducible_and_seed_sensitive():
    a = simulate(4, 32, 50, 100, steps=400, seed=7)
    b = simulate(4, 32, 50, 100, steps=400, seed=7)
    c = simulate(4, 32, 50, 100, steps=400, seed=8)
    assert a == b
    assert a.makespan != c.makespan


def test_simulated_load_matches_horizon_average():
    res = simulate(4, 256, 100, 500, requests=10_000, seed=1)
    assert res.mean_token_load == pytest.approx(mean_token_load(256, 100, 500, 10_000), rel=0.01)


def test_paper_mode_throughput_never_beats_the_realised_bottleneck():
    # makespan >= every stage's total work (an invariant, not agreement with the closed form)
    check = simulated_optimum(256, 100, 500, requests=2000, seed=0)
    f = check.fine
    bound = f["r"] * 256 / ((f["r"] + 1) * np.maximum(f["sim_attention_time"], f["ffn_time"]))
    assert np.all(f["sim_throughput"] <= bound * (1 + 1e-9))
    assert idle_crossing(f) is not None


def test_straggler_crossing_is_where_the_ffn_catches_the_slowest_instance():
    # the barrier waits for the slowest instance, so the FFN reaches it later than the mean (r_A = r*): the
    # simulated turn lies above r*, and the simulated optimum is an integer next to it
    check = simulated_optimum(128, 100, 500, requests=2000, seed=0)
    f = check.fine
    cross = straggler_crossing(f)
    assert cross is not None and cross > check.r_star
    assert abs(check.r_sim - cross) < 1
    below, above = f[f["r"] < cross], f[f["r"] > cross]
    assert (below["ffn_time"] < below["sim_straggler_time"]).all() and (above["ffn_time"] > above["sim_straggler_time"]).all()
    # the FFN-bound side (past the crossing) is where stragglers cost nothing: the simulation meets the theory there
    assert (above["sim_vs_theory_pct"].abs() < 1).all() and (below["sim_vs_theory_pct"].iloc[1:] < -1).all()
    assert straggler_crossing(f[f["r"] <= 2]) is None  # no crossing inside the rows given
    with pytest.raises(ValueError, match="sim_straggler_time"):
        straggler_crossing(f[["r", "ffn_time"]])


def test_common_random_numbers_across_r():
    # instance i sees the same requests at every r, so adding instances can only raise the
    # per-microbatch maximum: a sure property with common random numbers, not one in expectation
    for seed in range(5):
        stragglers = [simulate(r, 4, 50, 20, steps=40, seed=seed).mean_straggler_time for r in (1, 2, 3)]
        assert stragglers[0] <= stragglers[1] <= stragglers[2], stragglers


def test_stragglers_and_pipelining_matter():
    base = simulate(4, 128, 100, 300, requests=2000, seed=2)
    slow = simulate(4, 128, 100, 300, requests=2000, seed=2, speed_cv=0.3)
    serial = simulate(4, 128, 100, 300, requests=2000, seed=2, microbatches=1)
    assert slow.throughput_per_instance < base.throughput_per_instance
    assert slow.mean_straggler_time > base.mean_straggler_time
    # one microbatch in flight: attention, transfers and FFN run back to back
    assert serial.throughput_per_instance < 0.8 * base.throughput_per_instance
    assert serial.attention_idle > base.attention_idle


def test_sweep_columns_and_prompt_trace_resampling():
    df = sweep([1, 3], 64, 100, 200, requests=500, seed=0, prompt_lengths=np.array([10.0, 1000.0]))
    assert list(df["r"]) == [1, 3]
    assert {"theory_throughput", "sim_throughput", "sim_attention_idle", "sim_ffn_idle"} <= set(df.columns)


def test_h200_calibration():
    c = afd.coefficients_from_tables("h200")
    assert c.unit == "ms" and "least squares" in c.source and "DeepEP" in c.source
    assert c.a_F > 0 and c.b_F > 0 and c.a_A > 0 and c.a_C > 0
    terms = ratio_terms(256, 100, 500, 10_000, c)
    # on the H200 the MoE FFN's fixed weight read dominates: r* is the FFN peak, not attention
    assert terms.binding == "ffn_peak"
    assert 1 < terms.r_star < 50
    with pytest.raises(ValueError, match="shape"):
        afd.coefficients_from_tables("h200", "olmoe-1b-7b")
    with pytest.raises(ValueError, match="calibration must be a bundled GPU"):
        afd.coefficients_from_tables("a100")


def test_any_calibrate_folder_is_accepted_and_a_missing_table_is_named(tmp_path):
    import shutil

    from moelab.costmodel.tables import calibration_folder

    bundled = calibration_folder("h200")
    for table in ("attn_step.csv", "moe_step.csv", "dense_verify.csv"):  # what `moelab calibrate --out` writes
        shutil.copy(bundled / table, tmp_path / table)
    assert afd.coefficients_from_tables(tmp_path).as_dict() | {"source": ""} == \
        afd.coefficients_from_tables("h200").as_dict() | {"source": ""}
    assert afd.StageTables.from_calibration(str(tmp_path)).source.startswith(tmp_path.name)
    (tmp_path / "attn_step.csv").unlink()
    with pytest.raises(ValueError, match="lacks attn_step.csv"):
        afd.coefficients_from_tables(tmp_path)
    from moelab.costmodel import DecodeStepModel

    shutil.copy(bundled / "attn_step.csv", tmp_path / "attn_step.csv")
    # a folder from an older calibrate, without the whole-layer table the step model needs: named, with its writer
    with pytest.raises(ValueError, match=r"lacks decode_layer.csv.*moelab calibrate --out DIR"):
        DecodeStepModel.from_calibration(tmp_path)


def test_paper_coefficients_are_read_from_the_data_table():
    from moelab.afd.coefficients import paper_coefficients
    from moelab.datasets import bundled_path

    c = paper_coefficients()
    assert c.unit == "cycles" and "paper_coefficients.csv" in c.source
    assert c == afd.AFDCoefficients.paper()
    assert (bundled_path("afd", "PROVENANCE.md")).is_file()


def test_theory_and_calibration_do_not_import_each_other():
    import ast
    from pathlib import Path

    root = Path(afd.__file__).parent
    for name, forbidden in (("theory.py", {"moelab.afd.calibration", "moelab.afd.measured"}),
                            ("coefficients.py", {"moelab.afd.calibration", "moelab.afd.theory", "moelab.afd.measured"}),
                            ("calibration.py", {"moelab.afd.theory", "moelab.afd.measured"})):
        tree = ast.parse((root / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & forbidden, (name, imported & forbidden)


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 2048), mu_P=st.floats(0, 4000), mu_D=st.floats(0, 4000),
       fills=st.one_of(st.none(), st.floats(1, 1000)))
def test_r_star_at_least_r_peak_and_is_the_argmax(B, mu_P, mu_D, fills):
    N = None if fills is None else B * fills
    terms = ratio_terms(B, mu_P, mu_D, N)
    assert terms.r_star >= terms.r_peak
    f_star = afd.throughput_per_instance(terms.r_star, B, mu_P, mu_D, N)
    others = afd.throughput_per_instance(np.geomspace(0.01, 1000, 200), B, mu_P, mu_D, N)
    assert np.all(others <= f_star * (1 + 1e-9))


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 1024), mu_P=st.floats(0, 2000), mu_D=st.floats(0, 2000), d=st.floats(1, 500),
       fills=st.floats(1, 1000))
def test_r_star_monotone_in_lengths_and_horizon(B, mu_P, mu_D, d, fills):
    N = B * fills  # requests per instance: at least one fill of its B slots
    r0 = afd.optimal_ratio(B, mu_P, mu_D, N)
    assert afd.optimal_ratio(B, mu_P + d, mu_D, N) >= r0 - 1e-9
    assert afd.optimal_ratio(B, mu_P, mu_D + d, N) >= r0 - 1e-9
    assert afd.optimal_ratio(B, mu_P, mu_D, N * 2) >= r0 - 1e-9
    assert mean_token_load(B, mu_P, mu_D, N) <= mean_token_load(B, mu_P, mu_D) + 1e-6


def test_batched_sweep_equals_separate_runs():
    from moelab.afd.sim import _simulate_many

    batch = _simulate_many([1, 3, 6], 32, 80, 150, steps=300, seed=4, speed_cv=0.2)
    for res in batch:
        alone = simulate(res.r, 32, 80, 150, steps=300, seed=4, speed_cv=0.2)
        assert res.makespan == alone.makespan  # the schedule is identical, not just close
        for key, value in res.as_dict().items():  # sums in another order: equal to rounding
            assert value == (getattr(alone, key) if isinstance(value, str) else pytest.approx(getattr(alone, key), rel=1e-12)), key


def test_ratio_terms_repr_shows_binding_and_r_star():
    from moelab.afd import ratio_terms

    t = ratio_terms(256, 100, 500)
    text = repr(t)
    assert f"binding={t.binding!r}" in text and f"r_star={t.r_star!r}" in text and "t_A=" in text


@pytest.mark.parametrize("coeffs", [None, "h200"])
@pytest.mark.parametrize("B", [64, 128, 256, 512])
def test_attention_takeover_load_separates_the_regimes(B, coeffs):
    c = afd.coefficients_from_tables("h200", B=B) if coeffs == "h200" else None
    edge = afd.attention_takeover_load(B, c)
    for mu_P, mu_D in [(0, 10), (100, 100), (100, 500), (1000, 500), (4000, 1000), (20_000, 2000)]:
        t = afd.ratio_terms(B, mu_P, mu_D, None, c)
        assert (t.token_load > edge) == (t.binding == "attention"), (mu_P, mu_D, t)
    # just above the edge r_A equals the larger other candidate: the edge is where the regime changes
    scale = (c or afd.AFDCoefficients.paper())
    at_edge = (scale.a_A * edge + scale.b_A - scale.b_F) / (scale.a_F * B)
    t0 = afd.ratio_terms(B, 0, 0, None, c)
    assert at_edge == pytest.approx(max(t0.r_C, t0.r_peak))



def test_ratio_summary_is_ratio_terms_with_its_regime_edge():
    h200 = afd.coefficients_from_tables("h200", B=256)
    for c in (None, h200):
        row = afd.ratio_summary(256, 1155, 210, 2000, c)
        t = afd.ratio_terms(256, 1155, 210, 2000, c)
        assert row["r_star"] == t.r_star and row["binding"] == t.binding and row["token_load"] == t.token_load
        assert row["takeover_load"] == afd.attention_takeover_load(256, c)
        assert (row["token_load"] > row["takeover_load"]) == (row["binding"] == "attention")
    # the same workload: the paper's fit is attention-bound, the H200 fit sits at the FFN peak
    assert afd.ratio_summary(256, 1155, 210, 2000)["binding"] == "attention"
    assert afd.ratio_summary(256, 1155, 210, 2000, h200)["binding"] == "ffn_peak"


def _pipeline_numpy(attn, r, t_C, t_F, m, t_back=None):
    """The four-stage pipeline's job loop in plain numpy (the reference the compiled loop must equal bit for bit)."""
    r = np.asarray(r, dtype=np.int64)
    n = len(r)
    t1 = np.broadcast_to(np.asarray(t_C, dtype=np.float64), (n,))
    t2 = np.broadcast_to(np.asarray(t_F, dtype=np.float64), (n,))
    t3 = np.broadcast_to(np.asarray(t_C if t_back is None else t_back, dtype=np.float64), (n,))
    t12 = t1 + t2
    steps = np.stack([t1, t2, t3])
    starts = np.concatenate([[0], np.cumsum(r)[:-1]])
    col_of = np.concatenate([np.arange(k) for k in r])
    row_of = np.repeat(np.arange(n), r)
    t12_flat = t12[row_of]
    free = np.zeros(col_of.size)
    back = np.tile(-t12_flat, (m, 1))
    g = np.zeros((4, n))
    g[2], g[3] = -t1, -t12
    for j in range(attn.shape[0]):
        mb = j % m
        free = np.maximum(free, back[mb] + t12_flat) + attn[j, col_of]
        g[0] = np.maximum.reduceat(free, starts)
        g[1:] = np.maximum.accumulate(g, axis=0)[1:] + steps
        back[mb] = g[3][row_of]
    return g[3] + t12


def test_compiled_pipeline_equals_the_numpy_recurrence_bit_for_bit():
    # the job loop runs compiled (moelab.afd._pipeline_jit) for the panel's slider; every makespan must be the
    # numpy loop's exactly, for scalar and per-row link times, a separate return link, one or several microbatches
    from moelab.afd.sim import _pipeline

    rng = np.random.default_rng(7)
    for trial in range(6):
        r = np.sort(rng.choice(np.arange(1, 30), size=int(rng.integers(1, 6)), replace=False))
        attn = rng.gamma(2.0, 50.0, size=(int(rng.integers(1, 1500)), int(r.max())))
        n, m = len(r), int(rng.integers(1, 5))
        t_C = rng.uniform(0, 30, size=n) if trial % 2 else float(rng.uniform(0, 30))
        t_F = rng.uniform(10, 500, size=n)
        t_back = rng.uniform(0, 30, size=n) if trial % 3 == 0 else None
        assert np.array_equal(_pipeline(attn, r, t_C, t_F, m, t_back), _pipeline_numpy(attn, r, t_C, t_F, m, t_back))
