"""HD's speed numbers a reader can trust (issue 41), without a model: the verify-cost curve that follows the
machine (:class:`OnlineVerifyCost`), the engine's online choice between the plan and the full chain
(:class:`PolicyChoice`), the drafter's step timing that feeds both, and the paired bootstrap intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moelab.bench.hd import paired_figures
from moelab.costmodel.verify import ONLINE_WINDOW, OnlineVerifyCost, VerifyCost
from moelab.hd import HierarchyDrafter, NGramTable
from moelab.hd import drafters as drafters_mod
from moelab.hd.drafters import CostAwareDrafter
from moelab.hd.engine import cost_aware_rows
from moelab.hd.policy import PolicyChoice
from moelab.hd.results import paired_ratio, paired_table, same_steps, verdict

TRUE = VerifyCost([1, 2, 9, 17], [30.0, 33.0, 40.0, 50.0])  # what a step really costs on the machine (ms)
# the probe ran while another process held a core: every q >= 2 looked twice as dear as it is
BUSY_SEED = VerifyCost([1, 2, 9, 17], [30.0, 66.0, 80.0, 100.0])


def _rel_error(cost: VerifyCost, qs) -> float:
    return float(np.max(np.abs(np.asarray(cost.table)[qs] / TRUE(np.asarray(qs)) - 1)))


def test_a_curve_off_by_2x_converges_within_a_few_dozen_steps():
    rng = np.random.default_rng(0)
    online = OnlineVerifyCost(BUSY_SEED)
    assert _rel_error(online, [2, 5, 9]) > 0.9  # the seed is 2x off
    # the steps a cost-aware chain verifies: mostly q = 1 and short chains, 5 % noise
    qs = rng.choice([1, 2, 3, 5, 9], size=40, p=[0.4, 0.25, 0.15, 0.1, 0.1])
    for q in qs:
        online.observe(int(q), float(TRUE(q)) * rng.lognormal(0, 0.05))
    assert _rel_error(online, [1, 2, 3]) < 0.1  # the lengths it observed: within noise
    # a length it never observed (q = 13) takes the correction of its neighbours, not the seed's 2x
    assert online.table[13] / float(TRUE(13)) < 1.25
    assert np.all(np.diff(online.table) >= 0) and online.observations == 40
    # the plan reads the corrected table: a node now pays at a far lower acceptance than the seed said
    assert online.draft_threshold(8) < 0.5 * BUSY_SEED.draft_threshold(8)


def test_outliers_do_not_move_the_curve():
    rng = np.random.default_rng(1)
    online = OnlineVerifyCost(TRUE)
    for i in range(200):
        q = int(rng.choice([1, 2, 5, 9]))
        # one step in four preempted by another process: 3-10x its cost
        ms = float(TRUE(q)) * (rng.uniform(3, 10) if i % 4 == 0 else rng.lognormal(0, 0.03))
        online.observe(q, ms)
    assert _rel_error(online, [1, 2, 5, 9]) < 0.06
    steady = OnlineVerifyCost(TRUE)
    for _ in range(ONLINE_WINDOW):
        steady.observe(2, float(TRUE(2)))
    rebuilt = steady.rebuilds
    for _ in range(ONLINE_WINDOW // 2):  # a burst of outliers shorter than half the window changes nothing
        steady.observe(2, 10 * float(TRUE(2)))
    assert steady.rebuilds == rebuilt and _rel_error(steady, [2]) < 1e-9


def test_bad_observations_are_ignored_and_bad_settings_refused():
    online = OnlineVerifyCost(TRUE)
    for q, ms in ((0, 10.0), (999, 10.0), (2, float("nan")), (2, -1.0), (2, float("inf"))):
        online.observe(q, ms)
    assert online.observations == 0 and online.table == pytest.approx(TRUE.table)
    with pytest.raises(TypeError, match="seed must be a VerifyCost"):
        OnlineVerifyCost({"qs": [1], "ms": [1.0]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_obs"):
        OnlineVerifyCost(TRUE, window=3, min_obs=4)


def test_the_choice_follows_the_better_policy_and_keeps_testing_the_other():
    rng = np.random.default_rng(2)
    for better in (0, 1):
        ch = PolicyChoice()
        for _ in range(2000):
            arm = ch.choose(float(rng.random()))
            rate = 60.0 if arm == better else 50.0  # tokens/s of each policy
            tokens = float(rng.integers(1, 5))
            ch.record(arm, tokens, tokens / rate * rng.lognormal(0, 0.3))
        assert ch.best() == better
        share = ch.chosen[better] / sum(ch.chosen)
        assert 0.82 < share < 0.95  # exploration keeps ~10 % on the other
    ch = PolicyChoice()
    ch.record(0, 3.0, float("nan"))
    ch.record(1, 0.0, 1.0)
    assert ch.steps == [0, 0]
    with pytest.raises(ValueError):
        PolicyChoice(explore=0.9)


class _Clock:
    """A stand-in for the drafter's clock: each read returns the time set by the test."""

    def __init__(self) -> None:
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t


def test_the_drafter_times_the_steps_a_live_engine_runs(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(drafters_mod, "time", clock)
    S = NGramTable.build([[4, 10, 11, 12, 13]] * 3, key_lengths=(1,), length=4)
    online = OnlineVerifyCost(TRUE, min_obs=1)
    choice = PolicyChoice(warmup=1)
    d = CostAwareDrafter(HierarchyDrafter(S, None, order="WS", length=4), online, budget=4, chain=True,
                         timed=True, choice=choice)
    d.start([4, 1, 2, 3, 4])
    first = d.draft()  # the first step of a request: nothing to time yet (the gap before it is the prefill)
    q = 1 + (len(first.candidates[0]) if first.candidates else 0)
    assert online.observations == 0 and d.arms == [1, 0]  # the choice alternates during warm-up
    clock.t += 0.050  # the engine verifies q tokens in 50 ms
    d.accept([10, 11])
    d.draft()
    assert online.observations == 1 and online.corrections() == {q: pytest.approx(50.0 / float(TRUE(q)))}
    assert choice.steps == [1, 0] and choice.rate(0) == pytest.approx(2 / 0.050)
    # a replay (not timed) never touches the curve
    replay = CostAwareDrafter(HierarchyDrafter(S, None, order="WS", length=4), online, budget=4, chain=True)
    replay.start([4, 1, 2, 3, 4])
    for _ in range(3):
        replay.draft()
        replay.accept([7])
    assert online.observations == 1


def test_rows_of_a_live_engine_share_one_curve_and_one_choice():
    S = NGramTable.build([[4, 10, 11, 12, 13]] * 3, key_lengths=(1,), length=4)
    rows = cost_aware_rows(S, None, TRUE, budget=4, order="WS", online=True)
    assert isinstance(rows.cost_model, OnlineVerifyCost) and isinstance(rows.policy_choice, PolicyChoice)
    a, b = rows.factory(), rows.factory()
    assert a.cost is b.cost is rows.cost_model and a.choice is b.choice is rows.policy_choice
    off = cost_aware_rows(S, None, TRUE, budget=4, order="WS")
    assert off.cost_model is None and off.factory().cost is TRUE and off.factory().choice is None


def _paired_rows(ratio: float, n: int, noise: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    base = rng.uniform(20, 60, size=n)  # questions differ a lot in speed; the pair moves together
    cats = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]
    rows = []
    for i in range(n):
        for m, f in (("HD-fixed", 1.0), ("HD-cost", ratio * rng.lognormal(0, noise))):
            rows.append({"question_id": i, "category": cats[i % 6], "method": m, "tokens_per_s": base[i] * f})
    return pd.DataFrame(rows)


def test_paired_intervals_are_seeded_and_say_what_the_data_allow():
    df = _paired_rows(1.10, 60, 0.05)
    r = paired_ratio(df, "HD-cost", "HD-fixed")
    assert r == paired_ratio(df, "HD-cost", "HD-fixed")  # seeded
    assert r["ci_low"] < r["ratio"] < r["ci_high"] and r["questions"] == 60
    assert verdict(r["ci_low"], r["ci_high"]) == "ahead" and 1.05 < r["ratio"] < 1.15
    back = paired_ratio(df, "HD-fixed", "HD-cost")
    assert verdict(back["ci_low"], back["ci_high"]) == "behind"
    tied = paired_ratio(_paired_rows(1.0, 6, 0.2), "HD-cost", "HD-fixed")
    assert verdict(tied["ci_low"], tied["ci_high"]) == "not distinguishable"
    assert verdict(float("nan"), 2.0) == "not distinguishable"
    t = paired_table(df)
    assert set(t["b"]) == {"HD-fixed"} and "overall" in set(t["category"]) and len(t) == 7  # no suffix/ngram rows
    assert paired_ratio(df, "HD-cost", "suffix")["questions"] == 0


def test_same_steps_counts_the_questions_where_two_drafters_did_the_same_work():
    df = _paired_rows(1.0, 6, 0.2).assign(forwards=40.0, accepted_tokens=88.0)
    df.loc[(df["method"] == "HD-cost") & (df["question_id"] == 2), "forwards"] = 39.0  # one question drafted better
    df.loc[(df["method"] == "HD-cost") & (df["question_id"] == 4), "accepted_tokens"] = 87.0
    assert same_steps(df, "HD-cost", "HD-fixed") == (4, 6)
    assert same_steps(df, "HD-cost", "suffix") == (0, 0)  # never ran
    assert same_steps(df.drop(columns="forwards"), "HD-cost", "HD-fixed") == (0, 0)  # speeds only: nothing to say
    # the bench says it beside the ratio, and counts it as a figure of its own
    figs = {f.name: f for f in paired_figures(df, "slice")}
    assert figs["hd_vllm_vs_fixed_same_steps"].value == 4.0
    assert "the same steps on 4 of 6 questions" in figs["hd_vllm_vs_fixed_ratio"].note
