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
