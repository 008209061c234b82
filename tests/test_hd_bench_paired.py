"""``moelab bench hd``'s paired figures and its busy-core condition, without an engine."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from moelab.bench import hd as bench_hd


def _rows(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(12):
        base = rng.uniform(20, 40)
        for m, f in (("AR", 1.0), ("HD-cost", 1.8), ("HD-fixed", 1.7), ("suffix", 1.5), ("ngram", 1.5)):
            rows.append({"question_id": q, "category": "qa" if q % 2 else "rag", "method": m,
                         "tokens_per_s": base * f * rng.lognormal(0, 0.03)})
    return pd.DataFrame(rows)


def test_paired_figures_have_their_stable_names(tmp_path):
    figs = {f.name: f for f in bench_hd.paired_figures(_rows(), "test", tmp_path)}
    for stem in ("hd_vllm_vs_fixed", "hd_vllm_vs_suffix", "hd_vllm_vs_ngram"):
        assert f"{stem}_ratio" in figs and f"{stem}_ci_low" in figs
    assert figs["hd_vllm_vs_suffix_ratio"].value == pytest.approx(1.2, rel=0.03)
    assert figs["hd_vllm_vs_fixed_ci_low"].value < figs["hd_vllm_vs_fixed_ratio"].value
    assert "ahead" in figs["hd_vllm_vs_suffix_ratio"].note
    assert (tmp_path / "hd_vllm_paired.csv").is_file()
    no_suffix = _rows()
    figs = {f.name: f for f in bench_hd.paired_figures(no_suffix[no_suffix["method"] != "suffix"], "test")}
    assert np.isnan(figs["hd_vllm_vs_suffix_ratio"].value) and "skipped" in figs["hd_vllm_vs_suffix_ratio"].note


def _round_rows(methods, noise: float, rounds: int = 2, seed: int = 3, ratio: float = 1.0) -> pd.DataFrame:
    """Rows as run_pair_rounds gives them: every question, every round, both labels (64 tokens each)."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame([{"question_id": q, "category": "qa", "method": m, "round": r, "new_tokens": 64,
                          "tokens_per_s": base * (ratio if k == 0 else 1.0) * rng.lognormal(0, noise),
                          "output_ids": [q, 1, 2]}
                         for q, base in enumerate(rng.uniform(20, 40, size=12)) for r in range(rounds)
                         for k, m in enumerate(methods)])


def test_same_method_figures_give_the_benchs_resolution(tmp_path):
    a, b = f"{bench_hd.SAME_METHOD} (a)", f"{bench_hd.SAME_METHOD} (b)"
    figs = {f.name: f for f in bench_hd.same_method_figures(_round_rows((a, b), 0.08), "test", tmp_path)}
    r = figs["hd_vllm_same_ratio"].value
    assert figs["hd_vllm_same_ci_low"].value < r < figs["hd_vllm_same_ci_high"].value
    assert figs["hd_vllm_same_ci_low"].value < 1.0 < figs["hd_vllm_same_ci_high"].value  # 8 % noise: 1 inside
    assert "2 rounds over 12 questions" in figs["hd_vllm_same_ratio"].note
    assert (tmp_path / "hd_vllm_same_questions.csv").is_file()
    skipped = bench_hd.same_method_figures(pd.DataFrame(), "test")
    assert np.isnan(skipped[0].value) and "skipped" in skipped[0].note


def test_pooled_rounds_are_the_rate_of_the_rounds_taken_together():
    # 64 tokens in 2 s, then 64 in 6 s: 128 tokens in 8 s is 16 tokens/s (the mean of the two rates would be 21.3)
    df = pd.DataFrame([{"question_id": 1, "category": "qa", "method": "HD-cost", "round": r, "new_tokens": 64,
                        "tokens_per_s": tps} for r, tps in enumerate((32.0, 64 / 6))])
    pooled = bench_hd.pool_rounds(df)
    assert len(pooled) == 1 and pooled["tokens_per_s"].iloc[0] == pytest.approx(16.0)
    assert pooled["rounds"].iloc[0] == 2 and pooled["new_tokens"].iloc[0] == 128


def test_more_rounds_narrow_the_interval():
    """Pooling rounds averages the noise between back-to-back runs: 4 rounds at 8 % per run give a narrower
    interval than 1 round, on the same questions and noise."""
    labels = (f"{bench_hd.SAME_METHOD} (a)", f"{bench_hd.SAME_METHOD} (b)")
    width = {}
    for rounds in (1, 4):
        f = {x.name: x.value for x in bench_hd.same_method_figures(_round_rows(labels, 0.08, rounds, seed=5), "t")}
        width[rounds] = f["hd_vllm_same_ci_high"] - f["hd_vllm_same_ci_low"]
    assert width[4] < 0.75 * width[1]


def test_pair_rounds_alternate_and_go_over_every_question_in_turn(monkeypatch):
    calls = []

    def fake(questions, *, methods, budget, max_new_tokens, run_tag, progress, threads):
        (qid,) = questions["question_id"].tolist()
        calls.append((qid, methods[0], run_tag, threads))
        return pd.DataFrame([{"question_id": qid, "category": "qa", "method": methods[0], "new_tokens": 8,
                              "tokens_per_s": 4.0, "output_ids": [1]}]), {}

    monkeypatch.setattr(bench_hd, "run_vllm_methods", fake)
    qs = pd.DataFrame({"question_id": [11, 12, 13], "category": ["qa"] * 3})
    df = bench_hd.run_pair_rounds(qs, 8, bench_hd.PAIR, rounds=2, tag="busy-core", threads=1)
    order = [(q, m) for q, m, _, _ in calls]
    # round 0: 11 A B, 12 B A, 13 A B; round 1 starts over with the other order: 11 B A, ...
    assert order == [(11, "HD-cost"), (11, "HD-fixed"), (12, "HD-fixed"), (12, "HD-cost"), (13, "HD-cost"),
                     (13, "HD-fixed"), (11, "HD-fixed"), (11, "HD-cost"), (12, "HD-cost"), (12, "HD-fixed"),
                     (13, "HD-fixed"), (13, "HD-cost")]
    assert {t for _, _, t, _ in calls} == {"busy-core-pair-r0", "busy-core-pair-r1"} and {c[3] for c in calls} == {1}
    assert sorted(df["round"].unique()) == [0, 1] and set(df["method"]) == set(bench_hd.PAIR)
    calls.clear()
    same = bench_hd.run_pair_rounds(qs, 8, ("HD-fixed", "HD-fixed"), rounds=1)
    assert set(same["method"]) == {"HD-fixed (a)", "HD-fixed (b)"}  # one method, two labels, cached apart
    assert {t for _, _, t, _ in calls} == {"same-a-r0", "same-b-r0"}
    with pytest.raises(ValueError, match="rounds"):
        bench_hd.run_pair_rounds(qs, 8, bench_hd.PAIR, rounds=0)


def test_the_fixed_ratio_comes_from_the_pairs_rounds_when_given():
    rotation = _rows()  # HD-cost / HD-fixed about 1.8 / 1.7 there
    pair = _round_rows(bench_hd.PAIR, 0.01, rounds=3, ratio=1.0)
    figs = {f.name: f for f in bench_hd.paired_figures(rotation, "test", pair=pair)}
    assert figs["hd_vllm_vs_fixed_ratio"].value == pytest.approx(1.0, abs=0.02)
    assert "3 rounds per question" in figs["hd_vllm_vs_fixed_ratio"].note
    assert figs["hd_vllm_vs_suffix_ratio"].value == pytest.approx(1.2, rel=0.03)  # the rotation's, as before
    without = {f.name: f for f in bench_hd.paired_figures(rotation, "test")}
    assert without["hd_vllm_vs_fixed_ratio"].value == pytest.approx(1.8 / 1.7, rel=0.03)


def test_a_round_whose_output_differs_from_ar_fails_the_identity_check():
    ar = pd.DataFrame({"question_id": [0, 1], "method": "AR", "output_ids": [[0, 1, 2], [1, 1, 2]]})
    pair = pd.DataFrame({"question_id": [0, 1], "method": "HD-cost", "output_ids": [[0, 1, 2], [1, 1, 2]]})
    assert bench_hd._rounds_identical(pair, ar) and bench_hd._rounds_identical(None, ar)
    pair.at[1, "output_ids"] = [1, 9, 2]
    assert not bench_hd._rounds_identical(pair, ar)


def test_pair_rounds_read_the_environment(monkeypatch):
    monkeypatch.delenv(bench_hd.PAIR_ROUNDS_ENV, raising=False)
    assert bench_hd.pair_rounds() == bench_hd.PAIR_ROUNDS and bench_hd.pair_rounds(quick=True) == 1
    monkeypatch.setenv(bench_hd.PAIR_ROUNDS_ENV, "2")
    assert bench_hd.pair_rounds(quick=True) == 2
    for bad in ("0", "17", "two"):
        monkeypatch.setenv(bench_hd.PAIR_ROUNDS_ENV, bad)
        with pytest.raises(ValueError, match=bench_hd.PAIR_ROUNDS_ENV):
            bench_hd.pair_rounds()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def test_busy_core_spins_a_child_and_always_stops_it():
    with bench_hd.busy_core() as proc:
        assert proc is not None and proc.poll() is None
        pid = proc.pid
    assert not _alive(pid)
    with pytest.raises(RuntimeError), bench_hd.busy_core() as proc:  # stopped when the run fails too
        pid = proc.pid
        raise RuntimeError("the bench failed")
    assert not _alive(pid)
    with bench_hd.busy_core(False) as proc:
        assert proc is None
