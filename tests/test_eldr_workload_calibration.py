"""ELDR synthetic workload calibration: the statistics, the targets, the search, the calibrated defaults."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from moelab.datasets import load_routing_counts
from moelab.eldr import calibration as cal
from moelab.eldr.calibration import calibration_table
from moelab.eldr.workload import PAPER_REDUCTION_PCT, PAPER_RHO, SyntheticConfig, generate
from moelab.traces import bundled_trace_path, load_trace

SMALL = SyntheticConfig(num_layers=6, num_experts=32, top_k=4, model_name="small", n_domains=4,
                        prompt_len_mean=80, prefix_tokens=16, decode_tokens=8)


@pytest.fixture(scope="module")
def small_trace():
    return generate(96, SMALL, seed=2).trace


# ---------------------------------------------------------------- statistics

def test_decode_drift_exact_on_built_traces(small_trace):
    tr = small_trace
    T, L, k = SMALL.decode_tokens, SMALL.num_layers, SMALL.top_k
    n = tr.n_requests
    # every token routes to the same experts: halves and odd/even profiles are identical, no drift
    same = np.broadcast_to(np.arange(k, dtype=np.int16), (n * T, L, k)).copy()
    d = cal.decode_drift(replace(tr, decode_ids=same))
    assert d["decode_drift"] == pytest.approx(0.0, abs=1e-12) and d["cos_odd_even"] == pytest.approx(1.0)
    # first half on experts 0..k-1, second half on k..2k-1: halves share nothing, odd/even share half
    ids = same.reshape(n, T, L, k)
    ids[:, T // 2:] += k
    d = cal.decode_drift(replace(tr, decode_ids=ids.reshape(n * T, L, k)))
    assert d["cos_halves"] == pytest.approx(0.0, abs=1e-12) and d["cos_odd_even"] == pytest.approx(1.0)
    assert d["decode_drift"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="min_tokens"):
        cal.decode_drift(tr, min_tokens=T + 1)


def test_decode_drift_follows_drift_walk_not_drift_sigma():
    """drift_walk is what decode_drift identifies: it rises with the walk; a constant prefill->decode
    offset (drift_sigma) leaves it where it was."""
    cfg = replace(SMALL, decode_tokens=16, mix_max=0.0, subtopics=1)
    d = {(w, s): cal.decode_drift(generate(80, replace(cfg, drift_walk=w, drift_sigma=s), seed=1).trace)["decode_drift"]
         for w, s in ((0.0, 0.2), (0.0, 1.0), (1.5, 0.2))}
    assert d[1.5, 0.2] > d[0.0, 0.2] + 0.05
    assert abs(d[0.0, 1.0] - d[0.0, 0.2]) < 0.03


def test_domain_overlap_real_counts_recomputed():
    """OLMoE's overlap recomputed here from the JSON (per layer: mean pairwise cosine of the domains'
    normalised counts); identical domains give 1."""
    counts = load_routing_counts("olmoe")["expert_counts"]
    doms = ["arxiv", "book", "c4", "github", "wikipedia"]
    vals = []
    for layer in ("layer0", "layer7", "layer15"):
        F = np.array([[counts[d][layer].get(str(e), 0) for e in range(64)] for d in doms], float)
        F /= np.linalg.norm(F, axis=1, keepdims=True)
        vals.append(np.mean([F[i] @ F[j] for i in range(5) for j in range(5) if i != j]))
    real = cal.real_domain_overlap("olmoe")
    assert real["overlap"] == pytest.approx(np.mean(vals)) and real["by_layer"] == pytest.approx(vals)
    assert 0 < cal.real_domain_overlap("mixtral")["overlap"] <= 1
    with pytest.raises(ValueError, match="model"):
        cal.real_domain_overlap("qwen")


def test_domain_overlap_on_traces(small_trace):
    tr = small_trace
    ov = cal.domain_overlap(tr)
    assert 0 < ov < 1
    n, p0 = tr.n_requests, int(tr.prompt_lens[0])  # every request request 0's prompt length and counts
    one = replace(tr, prompt_tokens=np.resize(tr.prompt_tokens, n * p0), prompt_offsets=np.arange(n + 1) * p0,
                  prefill_counts=np.broadcast_to(tr.prefill_counts[:1], tr.prefill_counts.shape).copy(),
                  prefill_ids=None, prefill_probs=None)
    assert cal.domain_overlap(one) == pytest.approx(1.0)
    # mixing a second domain into every request pulls the domains' aggregates together
    lo = cal.domain_overlap(generate(96, replace(SMALL, mix_max=0.0), seed=2).trace)
    hi = cal.domain_overlap(generate(96, replace(SMALL, mix_max=0.5), seed=2).trace)
    assert hi > lo
    with pytest.raises(ValueError, match="2 domain labels"):
        cal.domain_overlap(replace(tr, domains=["x"] * tr.n_requests))


def test_generated_stats_keys(small_trace):
    s = cal.generated_stats(small_trace, batch=8, n_pairs=500)
    assert {"rho_raw", "rho_count_idf", "recall_raw", "recall_count_idf", "reduction_pct", "domain_overlap",
            "decode_drift"} <= set(s)
    assert -1 <= s["rho_count_idf"] <= 1 and 0 <= s["recall_raw"] <= 1


# ---------------------------------------------------------------- targets and search

def test_targets_come_from_sources():
    t = cal.calibration_targets(real_drift=0.05)
    assert (t["rho_count_idf"].low, t["rho_count_idf"].high) == PAPER_RHO
    assert (t["reduction_pct"].low, t["reduction_pct"].high) == PAPER_REDUCTION_PCT
    assert t["domain_overlap"].value == pytest.approx(cal.real_domain_overlap("olmoe")["overlap"])
    assert t["decode_drift"].value == 0.05 and t["decode_drift"].holds(0.06) and not t["decode_drift"].holds(0.08)
    assert t["rho_raw"].penalty(0.75) == 0 and t["rho_raw"].penalty(0.6) == pytest.approx(0.1 / 0.11)
    assert t["rho_count_idf"].penalty(0.75) == pytest.approx(0.06 / 0.11)
    assert t["domain_overlap"].weight < 1  # another model's statistic weighs less than the paper's
    path = bundled_trace_path(cal.REAL_TRACE)
    if path.is_file():  # the target is the bundled real trace's drift, measured now
        real = load_trace(path)
        assert cal.calibration_targets()["decode_drift"].value == pytest.approx(cal.decode_drift(real)["decode_drift"])


def test_calibrate_workload_small_search():
    tg = cal.calibration_targets(real_drift=0.05)
    grids = {"drift_walk": (0.0, 1.5), "domain_scale": (0.7, 1.0), "request_sigma": (0.6, 1.2),
             "mix_max": (0.0, 0.4), "drift_sigma": (0.2, 0.8)}
    res = cal.calibrate_workload(SMALL, n_requests=64, grids=grids, sweeps=1, newton_steps=0, batch=8, n_pairs=400,
                                 targets=tg)
    pts = res.points
    assert not any("gain" in c for c in pts.columns)  # never the TPOT gain
    assert set(cal.KNOBS) <= set(pts.columns) and pts["step"].iloc[-1] == "chosen (held-out seed)"
    for knob in cal.KNOBS:
        rows = pts[(pts["knob"] == knob) & pts["step"].str.startswith("sweep 1")]
        assert len(rows) >= 2 and (rows["statistic"] == cal.IDENTIFIES[knob]).all()
        assert getattr(res.config, knob) in set(rows[knob])  # the chosen value was evaluated
        assert rows["target"].eq(tg[cal.IDENTIFIES[knob]].value).all()
    # the last knob's choice minimises the joint loss among its evaluations (weighted distances to targets)
    rows = pts[pts["knob"] == "drift_sigma"]

    def loss(r):
        return sum(t.penalty(r[name]) for name, t in tg.items())

    best = rows.loc[rows.apply(loss, axis=1).idxmin(), "drift_sigma"]
    assert res.config.drift_sigma == best
    assert res.heldout_seed != res.train_seed and set(res.heldout) == set(res.train)
    assert set(res.extra["sensitivity"].index) == set(cal.KNOBS)


def test_calibrate_workload_joint_steps_never_raise_the_loss():
    tg = cal.calibration_targets(real_drift=0.05)
    grids = {"request_sigma": (0.6, 1.2), "mix_max": (0.0, 0.4)}
    res = cal.calibrate_workload(SMALL, n_requests=64, knobs=("request_sigma", "mix_max"), grids=grids, sweeps=1,
                                 newton_steps=2, batch=8, n_pairs=400, targets=tg)
    pts = res.points

    def joint(r):
        return sum(t.penalty(r[name]) for name, t in tg.items())

    before = joint(pts[pts["step"] == "before joint steps"].iloc[0])
    chosen = joint(pts[pts["step"] == "chosen (train seed)"].iloc[0])
    assert chosen <= before + 1e-12
    assert (pts["step"].str.startswith("joint step")).sum() <= 2


def test_calibrate_workload_bad_input():
    with pytest.raises(ValueError, match="sweeps"):
        cal.calibrate_workload(SMALL, sweeps=0)
    with pytest.raises(ValueError, match="knobs"):
        cal.calibrate_workload(SMALL, knobs=("sharpness",))
    with pytest.raises(ValueError, match="grids"):
        cal.calibrate_workload(SMALL, grids={"mix_max": (0.1,)})
    with pytest.raises(ValueError, match="mix_max"):
        cal.calibrate_workload(SMALL, grids={"mix_max": (0.1, 0.9)})
    with pytest.raises(ValueError, match="n_requests"):
        cal.calibrate_workload(SMALL, n_requests=4)
    with pytest.raises(ValueError, match="newton_steps"):
        cal.calibrate_workload(SMALL, newton_steps=-1)


# ---------------------------------------------------------------- the table notebook 01 shows

def test_calibration_table_of_a_given_trace(small_trace):
    t = calibration_table(trace=small_trace, batch=8, n_pairs=400, seed=0, real=False).set_index("key")
    s = cal.generated_stats(small_trace, batch=8, n_pairs=400, seed=0)
    for key in ("rho_count_idf", "reduction_pct", "domain_overlap", "decode_drift"):
        assert t.loc[key, "generated"] == pytest.approx(s[key])
    assert t.attrs["n_requests"] == small_trace.n_requests
    # the drift row says what it cosines (a student could not decode "1 - cos halves / cos odd-even")
    assert "cos(1st half, 2nd half) / cos(odd, even tokens)" in t.loc["decode_drift", "statistic"]
    assert "expert counts" in t.loc["decode_drift", "statistic"]


def test_calibration_table_small():
    t = calibration_table(SMALL, n_requests=64, seed=1, batch=8, n_pairs=400)
    chats, tasks = cal.real_column(cal.REAL_TRACE), cal.real_column(cal.REAL_TASK_TRACE)
    assert chats != tasks  # issue 40: each real trace is its own named column, never one mixed "real trace"
    assert {"statistic", "target", "source", "generated", chats, tasks, "within target"} <= set(t.columns)
    keys = list(t["key"])
    assert {"rho_count_idf", "rho_raw", "reduction_pct", "domain_overlap", "decode_drift", "recall_raw"} <= set(keys)
    row = t.set_index("key")
    assert row.loc["reduction_pct", "target"] == pytest.approx(0.5 * sum(PAPER_REDUCTION_PCT))
    assert row.loc["domain_overlap_mixtral", "target"] == pytest.approx(cal.real_domain_overlap("mixtral")["overlap"])
    assert np.isnan(row.loc["recall_raw", "target"])  # reported, not a target
    # the real columns are read now from the bundled stats files (regenerated by the lead), never typed in, each
    # from its own trace
    for name, col in ((cal.REAL_TRACE, chats), (cal.REAL_TASK_TRACE, tasks)):
        real = cal.load_real_stats(name)
        if real is not None:
            assert row.loc["rho_count_idf", col] == pytest.approx(real["rho_count_idf"])
            assert row.loc["recall_raw", col] == pytest.approx(real["recall_raw"])
    task = cal.load_real_stats(cal.REAL_TASK_TRACE)
    if task is not None:  # the same-task reduction is the Spec-Bench trace's; ShareGPT's labels are writing systems
        assert row.loc["reduction_pct", tasks] == pytest.approx(task["distinct_reduction_pct_label"])
        assert row.loc["reduction_pct", chats] is None or np.isnan(row.loc["reduction_pct", chats])
    with pytest.raises(ValueError, match="n_requests"):
        calibration_table(SMALL, n_requests=2)


# ---------------------------------------------------------------- the calibrated defaults

@pytest.mark.slow
def test_calibrated_defaults_reach_their_targets():
    """The SyntheticConfig defaults are the calibration's output; their docstring gives the statistics
    reached at n=256 on the held-out seed 1. Regenerated here (same n, seed, pairs) against the targets
    read now: the ones it reached must still hold (a recalibration is due when the real trace's
    drift moves, which makes this fail), the ones it did not are held to the documented shortfall."""
    tr = generate(256, SyntheticConfig(), seed=1).trace
    s = cal.generated_stats(tr, batch=32, n_pairs=4000, seed=1)
    tg = cal.calibration_targets()
    assert tg["rho_count_idf"].holds(s["rho_count_idf"]), s
    assert tg["rho_raw"].holds(s["rho_raw"]), s
    if "decode_drift" in tg:  # fails when the real trace's drift moves by > 0.02: recalibrate drift_walk
        assert tg["decode_drift"].holds(s["decode_drift"]), (s, tg["decode_drift"])
    # the reduction lands just below the paper's 17% (documented: 16.6%)
    assert PAPER_REDUCTION_PCT[0] - 0.6 <= s["reduction_pct"] <= PAPER_REDUCTION_PCT[1], s
    # OLMoE's overlap is not reached (it conflicts with the paper's reduction): documented 0.48 vs 0.57
    assert s["domain_overlap"] == pytest.approx(0.48, abs=0.02) and s["domain_overlap"] < tg["domain_overlap"].value


def test_sensitivity_slope_is_signed_least_squares():
    """The sensitivities go through the floor's non-negative fit_linear, yet stay signed least-squares slopes."""
    assert cal._slope(np.array([0.0, 1.0, 2.0]), [3.0, 1.0, -1.0]) == pytest.approx(-2.0)
    x, y = np.array([0.1, 0.4, 0.5, 0.9]), [0.3, -0.2, 0.8, 0.1]
    assert cal._slope(x, y) == pytest.approx(np.polyfit(x, y, 1)[0])
