"""The overview notebook runs headless and records the MoE-layer fact from the H200 tables."""

from __future__ import annotations

import pytest

from tests.helpers import execute_notebook


@pytest.mark.notebook
def test_overview_notebook(tmp_path):
    out = execute_notebook("00_overview", {"B": 256}, tmp_path)
    res = out["00_overview"]
    assert res["notebooks"] == ["01_eldr", "02_hierarchy_drafting", "03_afd_ratio", "04_dsd_rtt",
                                "05_balanceroute", "07_cross_paper", "06_from_your_deployment"]
    qwen = res["moe_layer"]["qwen3-30b-a3b"]
    # the measured headline of the calibration README: 47 us at D=8 vs 308 us at D=128
    assert (qwen["D_min"], qwen["D_max"]) == (8, 128)
    assert qwen["us_at_D_min"] == pytest.approx(47.3, abs=0.5)
    assert qwen["us_at_D_max"] == pytest.approx(308.1, abs=0.5)
    # the fitted model reproduces the growth with distinct experts
    assert qwen["fitted_ratio"] == pytest.approx(qwen["measured_ratio"], rel=0.15)
    assert all(s["measured_ratio"] > 1.5 for s in res["moe_layer"].values())
    assert res["fit_median_abs_err_pct"] < 10
    assert {"overview_lab_map.html", "overview_moe_time_vs_experts.html"} <= set(out["_figures"])
