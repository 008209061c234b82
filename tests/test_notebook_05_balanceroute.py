"""Notebook 05 (BalanceRoute) runs end to end with small parameters and records its key numbers."""

from __future__ import annotations

import math

import pytest

from moelab.course.agreement import assert_reads_cleanly
from moelab.presets import preset_values
from tests.helpers import execute_notebook

# the "ci" preset (moelab/presets.py: 8 ranks of 8 slots keep a waiting pool with a few hundred requests; the tiny
# MoE's bundled tokenizer), also the browser test's (tests/test_browser.py reads CI_PARAMS)
CI_PARAMS = {"PRESET": "ci"}
CI = preset_values("05_balanceroute", "ci")


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_05_balanceroute(tmp_path, public_data):
    out = execute_notebook("05_balanceroute", CI_PARAMS, tmp_path)
    # issue 40: every number its prose states agrees with its results or tables, and its figures read cleanly
    assert_reads_cleanly(tmp_path / "05_balanceroute.ipynb", out)
    res = out["05_balanceroute"]
    figs = set(out["_figures"])
    for name in ("05_imbalance_over_time", "05_costs_table", "05_throughput", "05_decision_time", "05_load_sweep",
                 "05_regime_heatmap", "05_regime_gain_vs_share", "05_paper_table", "05_dp_barrier"):
        assert f"{name}.html" in figs, name
    assert res["G_table"] == 8 and res["n_requests_arrival"] == CI["N_REQUESTS"]
    assert res["dropped_rows"] == {"zero_length": 0, "output_len>1000": 0}
    # both vLLM versions and the SGLang balancers ran next to BR
    assert {"vllm_dp@0.32", "vllm_dp@latest", "vllm_dp@legacy", "sglang_total_tokens", "br0", "brh_oracle",
            "brh_tuned_oracle"} <= set(res["routers"])
    # BR-0 must cut the barrier idle work clearly even on a small run
    assert res["br0_imbalance_reduction_pct"] > 30
    assert res["rate_factor"] > 1 and res["load"] == 1.2
    assert res["regime_points"] == (len(CI["REGIME_SHAPES"]) * len(CI["REGIME_CONTEXT"]) * len(CI["REGIME_SLOTS"])
                                    * len(CI["REGIME_G"]))
    assert math.isfinite(res["regime_max_gain_pct"])
    assert set(res["load_sweep_imbalance"]) >= {"0.8/br0", "1.2/br0", "1.2/jsq"}
    assert math.isfinite(res["br0_dispatch_ms_p50"]) and res["br0_dispatch_ms_p50"] > 0
    assert 0 <= res["sharegpt_known_prompt_share"] < 1
    metrics = {row["metric"] for row in res["paper_table"]}
    assert "JSQ avg imbalance (tokens)" in metrics and "BR-0 / JSQ imbalance" in metrics
