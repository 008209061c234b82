"""The AFD notebook runs headless with small parameters and records the paper's checks."""

from __future__ import annotations


import pytest

import moelab.afd as afd
from tests.helpers import execute_notebook


@pytest.mark.notebook
def test_afd_notebook(tmp_path):
    params = {"N": 3000, "h200_r_values": [2, 4, 5, 8]}
    out = execute_notebook("03_afd_ratio", params, tmp_path)
    res = out["03_afd_ratio"]
    assert len(res["check_values"]) == 5
    assert res["check_max_abs_err"] <= 0.1
    assert res["r_star"] == pytest.approx(afd.optimal_ratio(256, 100, 500, N=3000))
    # the simulated optimum within 10% of r* and the idle curves crossing next to it
    assert res["gap_pct"] <= 10.0
    assert res["interp_gap_pct"] <= 10.0
    assert abs(res["idle_cross_sim"] - res["r_star"]) / res["r_star"] <= 0.10
    assert res["max_abs_sim_vs_theory_pct"] <= 10.0
    assert [row["r"] for row in res["sweep"]][:3] == [1, 2, 4]
    assert len(res["ratio_table"]) == 36
    h200 = res["h200"]
    assert h200["binding"] == "ffn_peak" and h200["coefficients"]["unit"] == "ms"
    assert abs(h200["r_sim"] - h200["r_star"]) < 1.0
    trace = res["trace"]  # the trace section reads the bundled Azure 2023 trace
    assert trace["name"] == "azure-2023-conv" and trace["requests"] > 10_000
    assert trace["gap_pct"] <= 10.0
    assert "afd_trace_throughput.html" in out["_figures"]
    assert {"afd_throughput.html", "afd_idle.html", "afd_ratio_table.html", "afd_h200_throughput.html"} <= set(out["_figures"])
