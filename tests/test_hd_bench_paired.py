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


def test_same_method_figures_give_the_benchs_resolution(tmp_path):
    rng = np.random.default_rng(3)
    a, b = (f"{bench_hd.SAME_METHOD} ({t[-1]})" for t in bench_hd.SAME_METHOD_TAGS)
    rows = [{"question_id": q, "category": "qa", "method": m, "tokens_per_s": base * rng.lognormal(0, 0.08)}
            for q, base in enumerate(rng.uniform(20, 40, size=12)) for m in (a, b)]
    figs = {f.name: f for f in bench_hd.same_method_figures(pd.DataFrame(rows), "test", tmp_path)}
    r = figs["hd_vllm_same_ratio"].value
    assert figs["hd_vllm_same_ci_low"].value < r < figs["hd_vllm_same_ci_high"].value
    assert figs["hd_vllm_same_ci_low"].value < 1.0 < figs["hd_vllm_same_ci_high"].value  # 8 % noise: 1 inside
    assert (tmp_path / "hd_vllm_same_questions.csv").is_file()
    skipped = bench_hd.same_method_figures(pd.DataFrame(), "test")
    assert np.isnan(skipped[0].value) and "skipped" in skipped[0].note


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
