"""Spread, tail and ablation figures of notebook 01 (issue 40): a verdict accounts for seed-to-seed spread, a worse
p99 is explained by the batches its slowest requests decoded in, and the two real traces are named apart."""

from __future__ import annotations

import numpy as np
import pytest

from moelab.eldr import experiments as ex
from moelab.eldr.locality import REAL_TRACES, heldout_rho, locality_contrast
from moelab.eldr.workload import SyntheticConfig, generate
from moelab.traces import bundled_trace_path
from tests.test_eldr import small_cost

SMALL = SyntheticConfig(num_layers=6, num_experts=32, top_k=4, model_name="small", n_domains=4,
                        prompt_len_mean=80, prefix_tokens=16, decode_tokens=8)


@pytest.fixture(scope="module")
def setup():
    return ex.prepare(generate(240, SMALL, seed=3).trace, small_cost(), 4, n_pairs=2000)


def test_gain_interval_says_ahead_behind_or_not_distinguishable():
    ahead = ex.gain_interval([10.0, 10.2, 9.9, 10.1], [9.0, 9.1, 8.9, 9.2])
    assert ahead["verdict"] == "ahead" and ahead["gain_lo_pct"] > 0 and ahead["n_seeds"] == 4
    assert ahead["gains_pct"][0] == pytest.approx(10.0)
    behind = ex.gain_interval([9.0, 9.1, 8.9, 9.2], [10.0, 10.2, 9.9, 10.1])
    assert behind["verdict"] == "behind" and behind["gain_hi_pct"] < 0
    # a +0.5% mean whose seeds disagree in sign is not a gain
    noisy = ex.gain_interval([10.0, 10.0, 10.0, 10.0], [9.8, 10.15, 9.9, 10.05])
    assert noisy["verdict"] == "not distinguishable" and noisy["gain_lo_pct"] < 0 < noisy["gain_hi_pct"]
    with pytest.raises(ValueError, match="at least 2 seeds"):
        ex.gain_interval([10.0], [9.0])
    with pytest.raises(ValueError, match="one value per seed"):
        ex.gain_interval([10.0, 9.0], [9.0, 9.0, 9.0])


def test_seed_spread_pairs_every_router_on_the_same_seeds(setup):
    sp = ex.seed_spread(setup, rates=(2400.0,), seeds=(0, 1, 2), n_requests=120, output_len=16)
    row = sp.iloc[0]
    assert row["n_seeds"] == 3 and len(row["gains_pct"]) == 3 and row["best_baseline"] in ex.BASELINES
    assert row["gain_lo_pct"] <= row["gain_pct"] <= row["gain_hi_pct"]
    assert row["verdict"] in ("ahead", "behind", "not distinguishable")
    # the per-seed gains are the single runs' gains against the chosen baseline, seed by seed
    one = {r: ex.run_one(setup, r, rate=2400.0, n_requests=120, output_len=16, seed=1)["tpot_ms_p50"]
           for r in (row["best_baseline"], "eldr")}
    assert row["gains_pct"][1] == pytest.approx(100 * (1 - one["eldr"] / one[row["best_baseline"]]))
    with pytest.raises(ValueError, match="seed"):
        ex.seed_spread(setup, rates=(2400.0,), seeds=(0, 1), seed=3)
    with pytest.raises(ValueError, match="at least 2"):
        ex.seed_spread(setup, rates=(2400.0,), seeds=(0,))


def test_tail_batches_explain_the_tail(setup):
    m = ex.run_one(setup, "eldr", rate=2400.0, n_requests=200, output_len=16, tail=True)
    assert m["peak_batch"] >= m["tail_batch"] > 0 and m["rest_batch"] > 0
    assert 0 < m["tail_worker_share"] <= 1 and m["tail_requests"] >= 1
    # the slowest requests decode in fuller batches than the rest (a step's time grows with its batch)
    assert m["tail_batch"] >= m["rest_batch"]
    assert "peak_batch" not in ex.run_one(setup, "eldr", rate=2400.0, n_requests=50, output_len=16)
    with pytest.raises(ValueError, match="tail_pct"):
        ex.tail_batches(None, tail_pct=0)


def test_ablation_effect_and_spread(setup):
    df = ex.tau_sweep(setup, (0.0, 2.0), rate=2400.0, n_requests=120, output_len=16)
    eff = ex.ablation_effect(df, "tau")
    p50 = dict(zip(df["tau"].astype(str), df["tpot_ms_p50"]))
    assert p50[eff["fastest"]] == min(p50.values()) and p50[eff["slowest"]] == max(p50.values())
    assert eff["spread_pct"] == pytest.approx(100 * (max(p50.values()) / min(p50.values()) - 1))
    with pytest.raises(ValueError, match="column"):
        ex.ablation_effect(df, "nope")
    spread = ex.ablation_spread(ex.tau_sweep, setup, "tau", seeds=(0, 1, 2), taus=(0.0, 2.0), rate=2400.0,
                                n_requests=120, output_len=16)
    assert spread["n_seeds"] == 3 and set(spread["settings"]) == {"0.0", "2.0"}
    assert spread["spread_lo_pct"] <= spread["spread_pct"] <= spread["spread_hi_pct"]
    assert spread["distinguishable"] == (spread["spread_lo_pct"] > 0)
    assert spread["table"]["tpot_ms_p50"].tolist() == pytest.approx(df["tpot_ms_p50"].tolist())  # seed 0's table


@pytest.mark.skipif(not all(bundled_trace_path(n).is_file() for n in REAL_TRACES), reason="real traces not bundled")
def test_locality_contrast_names_both_real_traces():
    c = locality_contrast(n_pairs=2000).set_index("trace")
    assert set(c.index) == set(REAL_TRACES) and c["display"].nunique() == 2
    tasks, chats = c.loc["sharegpt-moe-specbench"], c.loc["sharegpt-moe-sharegpt"]
    # the task-labelled questions show more locality than the chats, and most of it is between tasks
    assert tasks["rho"] > chats["rho"]
    assert tasks["rho_within_label_hi"] < tasks["rho"]
    assert np.isfinite(chats["rho_long_prompts"]) and chats["long_prompt_tokens"] == tasks["median_prompt_tokens"]
    with pytest.raises(ValueError, match="requests"):
        from moelab.traces import load_trace  # lazy: only this check needs a trace object
        heldout_rho(load_trace(bundled_trace_path("sharegpt-moe-specbench")).subset(np.arange(2)))


def test_headline_figure_axes_carry_units():
    import pandas as pd  # lazy: only this test builds a table by hand

    from moelab.viz import eldr as viz  # lazy: plotly only for this test

    df = pd.DataFrame([{"router": r, "rate": x, "tpot_ms_p50": 10.0 + x / 100, "distinct_per_layer_step": 30.0}
                       for r in ("jsq", "eldr", "domain_oracle") for x in (20.0, 100.0)])
    fig = viz.fig_rate_sweep(df)
    titles = [ax.title.text for name, ax in fig.layout.to_plotly_json().items() if name.startswith(("xaxis", "yaxis"))
              for ax in [getattr(fig.layout, name)]]
    assert len(titles) == 4
    # issue 40: each axis states its unit: req/s (at the paper's 16 workers), ms per output token, a count of experts
    assert all("(" in t and ")" in t for t in titles), titles
    assert any("req/s at 16 decode workers" in t for t in titles) and any("ms per output token" in t for t in titles)
