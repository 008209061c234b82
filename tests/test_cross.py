"""Cross-paper module: ELDR picks the instance, BalanceRoute picks the rank (small, seconds)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from moelab import cross
from moelab.routers import make_router
from moelab.sim.cluster import simulate
from moelab.traces import replay_requests


@pytest.fixture(scope="module")
def setup():
    return cross.prepare(n_instances=2, ranks=2, slots=8, n_trace=160, output_len=64, attention_share=0.4,
                         n_pairs=800, n_domains=4)


def test_pair_grid_and_gains(setup):
    rate = cross.rate_for_load(setup, 1.0)
    df = cross.pair_grid(setup, rate=rate, n_requests=120)
    assert len(df) == len(cross.INSTANCE_ROUTERS) * len(cross.RANK_ROUTERS)
    assert set(df["pair"]) >= {"jsq x jsq", "eldr x br0", "eldr x brh"}
    g = cross.gains(df)
    assert g["additive_gain_pct"] == pytest.approx(g["eldr_only_gain_pct"] + g["br_only_gain_pct"])
    assert g["best_pair_gain_pct"] >= max(g["eldr_only_gain_pct"], g["br_only_gain_pct"], g["both_gain_pct"]) - 1e-9
    t = cross.pair_gains_table(df)
    assert t.loc[t["pair"] == "jsq x jsq", "tpot_ms_p50_gain_pct"].iloc[0] == 0.0
    # ELDR's lever is visible: fewer distinct experts per step than JSQ at the instance level
    d = df.groupby("instance_router")["distinct_per_layer_step"].mean()
    assert d["eldr"] < d["jsq"]


def test_attention_share_and_variant(setup):
    assert setup.cost.attention_share(setup.slots, setup.reference_ctx) == pytest.approx(0.4, abs=1e-6)
    v = cross.variant(setup, n_instances=3, attention_share=0.2)
    assert v.n_instances == 3 and v.eldr.centroids().shape[0] == 3
    assert v.cost.attention_share(v.slots, v.reference_ctx) == pytest.approx(0.2, abs=1e-6)
    with pytest.raises(ValueError, match="attention_share"):
        cross.variant(setup, attention_share=1.5)
    with pytest.raises(ValueError, match="lengths"):
        cross.prepare(lengths="nope")


@pytest.mark.parametrize("name", ["br0", "brh"])
def test_balanceroute_routes_instances_in_the_eldr_cluster(setup, name):
    """Any router whose requirements the ELDR decode cluster fills runs in it, BR-0/BR-H included."""
    pool = setup.eldr.pool
    reqs = replay_requests(pool, rate=50.0, n_requests=60, output_len=16)
    res = simulate(reqs, make_router(name), setup.eldr.cost, n_workers=3, trace=pool, bits=setup.eldr.bits)
    assert np.isfinite(res.finish_s).all()
    assert set(res.worker) <= {0, 1, 2}


def test_panel_and_figures_draw_a_pair_gains_table():
    from moelab.viz import cross as cviz

    rows = [{"pair": f"{i} x {r}", "instance_router": i, "rank_router": r, "tpot_ms_p50_gain_pct": g,
             "tpot_ms_p99_gain_pct": g / 2, "distinct_per_layer_step": 40.0, "avg_imbalance": 100.0, "rate": 12.0}
            for (i, r), g in zip([(i, r) for i in cross.INSTANCE_ROUTERS for r in cross.RANK_ROUTERS], range(6))]
    table = pd.DataFrame(rows)
    calls = []

    def run(**kw):
        calls.append(kw)
        return table

    box = cviz.panel(run, K=2, G=2, load=1.0, tau=0.1, attention_share=0.3)
    assert calls == [{"K": 2, "G": 2, "load": 1.0, "tau": 0.1, "attention_share": 0.3}]
    sliders = box.children[0].children[0].children
    sliders[0].value = 3  # moving a slider re-runs and redraws
    assert calls[-1]["K"] == 3
    assert len(cviz.pairs_figure(table).data) == 2 * len(cross.RANK_ROUTERS)
    assert len(cviz.causes_figure(table).data) == 2 * len(cross.RANK_ROUTERS)


def test_seed_spread_and_the_price_of_eldrs_lever(setup):
    rate = cross.rate_for_load(setup, 1.0)
    grids = cross.pair_grids(setup, rate=rate, seeds=(0, 1), n_requests=80)
    assert sorted(set(grids["seed"])) == [0, 1] and len(grids) == 2 * 6
    by_seed = cross.gains_by_seed(grids)
    one = cross.gains(grids[grids["seed"] == 1])
    row = by_seed.set_index("seed").loc[1]
    assert row["both_gain_pct"] == pytest.approx(one["both_gain_pct"])
    assert row["interaction_pts"] == pytest.approx(one["both_gain_pct"] - one["additive_gain_pct"])
    # the expert term grows with the distinct experts and is zero without any
    assert cross.expert_term_ms(setup, 0.0, 16) == pytest.approx(0.0, abs=1e-12)
    assert 0 < cross.expert_term_ms(setup, 10.0, 16) < cross.expert_term_ms(setup, 20.0, 16)
    with pytest.raises(ValueError, match="seed"):
        cross.gains_by_seed(grids.drop(columns="seed"))
    # a draw counted twice is refused, in the runs and in the frame
    with pytest.raises(ValueError, match=r"seeds must be distinct.*\[1\]"):
        cross.pair_grids(setup, rate=rate, seeds=(1, 0, 1), n_requests=80)
    with pytest.raises(ValueError, match="seed"):
        cross.pair_grids(setup, rate=rate, seeds=(0,), seed=3, n_requests=80)
    with pytest.raises(ValueError, match="more than once for seed 0"):
        cross.gains_by_seed(pd.concat([grids, grids[grids["seed"] == 0]], ignore_index=True))
    # ELDR's lever, priced per draw: the expert term of JSQ x JSQ's distinct experts minus ELDR's, at JSQ's batch
    one_grid = grids[grids["seed"] == 1]
    lever = cross.eldr_lever(setup, one_grid)
    rows = one_grid.set_index("pair")
    batch = float(rows.loc["jsq x jsq", "mean_batch"])
    saved = (cross.expert_term_ms(setup, float(rows.loc["jsq x jsq", "distinct_per_layer_step"]), batch)
             - cross.expert_term_ms(setup, float(rows.loc["eldr x jsq", "distinct_per_layer_step"]), batch))
    assert lever["saved_ms"] == pytest.approx(saved)
    assert lever["lever_pct"] == pytest.approx(100 * saved / float(rows.loc["jsq x jsq", "step_ms_mean"]))
    with pytest.raises(ValueError, match="one draw"):
        cross.eldr_lever(setup, grids)  # two draws at once
    with pytest.raises(ValueError, match="eldr x jsq"):
        cross.eldr_lever(setup, one_grid[one_grid["pair"] != "eldr x jsq"])


def test_the_cross_spread_constant_has_its_own_name():
    """One name, one meaning: ELDR's seed count is ELDR's; the cross-paper experiment's is CROSS_SPREAD_SEEDS."""
    assert isinstance(cross.CROSS_SPREAD_SEEDS, int) and cross.CROSS_SPREAD_SEEDS >= 2
    assert not hasattr(cross, "SPREAD_SEEDS") and "SPREAD_SEEDS" not in cross.__all__


@pytest.mark.parametrize(("values", "pattern"), [
    ([2.0, 3.5], "above"),
    ([-2.0, -1.5], "below"),          # every draw sub-additive beyond the tolerance
    ([0.0, 0.4, 1.0], "additive"),     # every draw within [0, tolerance]
    ([-0.9, 0.3], "additive"),
    ([-3.0, 2.0], "mixed_sign"),      # beyond the tolerance on both sides
    ([-1.5, 0.3, 1.2], "mixed_sign"),
    ([0.2, 2.0], "at_or_above"),
    ([-0.5, 2.0], "at_or_above"),      # -0.5 is within the tolerance: additive, not sub-additive (a student read)
    ([-1.0, 1.6, 1.8], "at_or_above"),  # the tolerance's edge counts as within it
    ([-2.0, -0.2, 0.0], "at_or_below"),
    ([-2.0, 0.9], "at_or_below"),
])
def test_interaction_pattern_names_every_case(values, pattern):
    assert cross.interaction_pattern(values, 1.0) == pattern
    assert pattern in cross.INTERACTION_PATTERNS


def test_interaction_pattern_refuses_no_or_bad_draws():
    for bad in ([], [float("nan")], [1.0, float("inf")]):
        with pytest.raises(ValueError, match="interaction_pts"):
            cross.interaction_pattern(bad, 1.0)
    with pytest.raises(ValueError, match="tolerance"):
        cross.interaction_pattern([1.0], -0.1)


def test_br_share_trend_runs_the_jsq_instance_pairs_and_reuses_known_grids(setup):
    """BalanceRoute's gain per (share, draw): only the three JSQ-instance pairs run, a known grid at the setup's
    share is reused (the same gains as running it), and a known grid at another rate is refused."""
    seeds = (0, 1)
    rate = cross.rate_for_load(setup, 1.0)
    known = cross.pair_grids(setup, rate=rate, seeds=seeds, n_requests=60)
    trend = cross.br_share_trend(setup, (0.4, 0.2), seeds=seeds, load=1.0, known={0.4: known}, n_requests=60)
    assert trend["attention_share"].tolist() == [0.2, 0.2, 0.4, 0.4] and trend["seed"].tolist() == [0, 1, 0, 1]
    fresh = cross.br_share_trend(setup, (0.4,), seeds=seeds, load=1.0, n_requests=60)
    assert trend[trend["attention_share"] == 0.4]["br_only_gain_pct"].tolist() == pytest.approx(
        fresh["br_only_gain_pct"].tolist())
    assert trend[trend["attention_share"] == 0.4]["br_only_gain_pct"].tolist() == pytest.approx(
        cross.gains_by_seed(known)["br_only_gain_pct"].tolist())
    # the higher share reads more KV bytes per token
    scale = trend.groupby("attention_share")["attn_scale"].first()
    assert scale[0.4] > scale[0.2] > 0
    with pytest.raises(ValueError, match="another rate"):
        cross.br_share_trend(setup, (0.4,), seeds=seeds, load=1.2, known={0.4: known}, n_requests=60)
    with pytest.raises(ValueError, match="each once"):
        cross.br_share_trend(setup, (0.2, 0.2), seeds=seeds, n_requests=60)


def _trend(gains_by_seed: dict[int, list[float]], shares=(0.1, 0.3, 0.5)) -> pd.DataFrame:
    return pd.DataFrame([{"attention_share": s, "seed": seed, "br_only_gain_pct": g}
                         for seed, gains in gains_by_seed.items() for s, g in zip(shares, gains)])


def test_share_trend_summary_decides_by_the_interval_over_draws():
    # every draw rises by one point per 10 points of share, give or take: the interval is above zero
    rising = cross.share_trend_summary(_trend({0: [1.0, 3.0, 5.0], 1: [1.5, 3.3, 5.6], 2: [0.8, 2.9, 4.7]}))
    assert rising["verdict"] == "ahead" and rising["n_rising"] == 3 and rising["n_draws"] == 3
    assert rising["slope_by_seed"][0] == pytest.approx(1.0)
    assert rising["slope_lo"] < rising["slope_mean"] < rising["slope_hi"] and rising["slope_lo"] > 0
    assert [r["mean"] for r in rising["by_share"]] == pytest.approx([1.1, 3.0 + 0.2 / 3, 5.1])
    # two points of one draw cannot decide it: the old reading (last share above the first) would say "grows"
    noisy = cross.share_trend_summary(_trend({0: [1.0, 0.5, 3.0], 1: [4.0, 1.0, 2.0], 2: [2.0, 2.5, 1.0]}))
    assert noisy["verdict"] == "not distinguishable" and noisy["slope_lo"] < 0 < noisy["slope_hi"]
    falling = cross.share_trend_summary(_trend({0: [5.0, 3.0, 1.0], 1: [5.2, 3.1, 1.1]}))
    assert falling["verdict"] == "behind" and falling["n_rising"] == 0
    one_share = cross.share_trend_summary(_trend({0: [2.0], 1: [3.0]}, shares=(0.5,)))
    assert one_share["verdict"] == "not tested" and math.isnan(one_share["slope_lo"])
    with pytest.raises(ValueError, match="br_share_trend"):
        cross.share_trend_summary(pd.DataFrame({"seed": [0]}))


def _by_seed(both: list[float], br_only: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"seed": range(len(both)), "both_gain_pct": both, "br_only_gain_pct": br_only})


def test_eldr_added_summary_decides_by_the_interval_over_draws():
    # the student's run: ELDR adds +1.4, +0.5, +1.2 points on top of BalanceRoute; every draw positive, yet the
    # interval of the mean holds zero, so counting signs would call it a gain that three draws cannot tell
    student = cross.eldr_added_summary(_by_seed([4.837, 5.025, 6.318], [3.458, 4.495, 5.088]))
    added = [4.837 - 3.458, 5.025 - 4.495, 6.318 - 5.088]
    assert student["n_positive"] == student["n_draws"] == 3
    assert student["added_mean"] == pytest.approx(np.mean(added))
    assert student["added_min"] == pytest.approx(min(added)) and student["added_max"] == pytest.approx(max(added))
    assert student["added_lo"] < 0 < student["added_hi"] and student["verdict"] == "not distinguishable"
    half = student["added_hi"] - student["added_mean"]
    assert half == pytest.approx(4.303 * np.std(added, ddof=1) / np.sqrt(3), rel=1e-3)  # t_{0.975, 2} = 4.303
    # tight draws above zero: ELDR adds a gain; below zero: it costs
    assert cross.eldr_added_summary(_by_seed([5.0, 5.1, 4.9], [4.0, 4.0, 4.0]))["verdict"] == "ahead"
    assert cross.eldr_added_summary(_by_seed([3.0, 3.1, 2.9], [4.0, 4.0, 4.0]))["verdict"] == "behind"
    # both against eldr_only is not the test: a large both with nothing added over br_only is not a gain
    nothing = cross.eldr_added_summary(_by_seed([5.0, 6.0, 4.0], [5.1, 5.9, 4.0]))
    assert nothing["verdict"] == "not distinguishable"
    one = cross.eldr_added_summary(_by_seed([5.0], [4.0]))
    assert one["verdict"] == "not distinguishable" and math.isnan(one["added_lo"])
    with pytest.raises(ValueError, match="gains_by_seed"):
        cross.eldr_added_summary(pd.DataFrame({"seed": [0]}))
