"""Notebook 05 (BalanceRoute) runs end to end with small parameters and records its key numbers."""

from __future__ import annotations

import math

import pytest

from tests.helpers import execute_notebook

CI_PARAMS = {"N_REQUESTS": 700, "G_VALUES": [4, 8], "SLOTS": 16, "BACKLOG_N": 2500, "INTERACTIVE_N": 200,
             "WINDOW": 128}


@pytest.mark.notebook
def test_notebook_05_balanceroute(tmp_path, public_data):
    out = execute_notebook("05_balanceroute", CI_PARAMS, tmp_path)
    res = out["05_balanceroute"]
    figs = set(out["_figures"])
    for name in ("05_imbalance_over_time", "05_throughput", "05_tpot_p95", "05_decision_time", "05_paper_table"):
        assert f"{name}.html" in figs
    assert res["G_table"] == 8
    assert res["n_requests_arrival"] == 700
    assert res["dropped_rows"] == {"zero_length": 0, "output_len>1000": 0}
    # BR-0 must cut the barrier idle work clearly even on a small run
    assert res["br0_imbalance_reduction_pct"] > 30
    assert res["br0_backlog_imbalance_reduction_pct"] > 30
    assert 0.5 < res["learned_auc"] <= 1.0
    assert res["learned_mae_tokens_h72"] < res["learned_mae_constant_tokens_h72"]
    assert 0.5 < res["learned_auc_h72"] <= 1.0
    assert math.isfinite(res["br0_dispatch_ms_p50"]) and res["br0_dispatch_ms_p50"] > 0
    assert set(res["imbalance_reduction_by_G"]) >= {"4/br0", "8/br0", "8/brh_oracle", "8/brh_learned"}
