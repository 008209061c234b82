"""The AFD notebook runs headless with small parameters and records both the reproduction and the test."""

from __future__ import annotations

import pytest

import moelab.afd as afd
from tests.helpers import execute_notebook

# small sizes, also the browser test's (tests/test_browser.py reads CI_PARAMS and turns the panels on)
CI_PARAMS = {"N": 2000, "r_values": [1, 2, 4, 8, 16], "trace_r_values": [1, 4, 16], "indep_requests": 300,
             "map_B": [128], "map_mu_P": [100], "map_mu_D": [100], "map_distributions": ["geometric", "azure-code"],
             "map_requests": 200, "interactive": False}


@pytest.mark.notebook
def test_afd_notebook(tmp_path):
    out = execute_notebook("03_afd_ratio", CI_PARAMS, tmp_path)
    res = out["03_afd_ratio"]
    assert len(res["check_values"]) == 5 and res["check_max_abs_err"] <= 0.1
    assert res["r_star"] == pytest.approx(afd.optimal_ratio(256, 100, 500, N=2000))
    assert len(res["ratio_table"]) == 36
    ind = res["indep"]
    # the independent simulation: recorded as measured, with its fit errors and extrapolation counts
    assert ind["lengths"] == "azure-conv" and 32 in ind["r_values"] and ind["sim_le_stage_bound"]
    assert {e["stage"] for e in ind["fit_errors"]} == {"attention", "ffn", "link"}
    assert ind["coverage"]["ffn_extrapolated"] > 0 and ind["coverage"]["notes"]
    assert ind["gap_pct"] == pytest.approx(100 * (ind["r_sim"] - ind["r_star"]) / ind["r_star"])
    assert len(res["gap_map"]) == 2 and {r["lengths"] for r in res["gap_map"]} == {"geometric", "azure-code"}
    assert {"r32_gap_pct", "b128", "verdict"} <= set(res)
    assert len(res["verdict"]) == 5 and all(isinstance(v["holds"], bool) for v in res["verdict"])
    assert 0 <= res["gap_map_integer_agreement"] <= 1
    assert res["trace"]["name"] == "azure-2023-conv" and res["trace"]["requests"] > 10_000
    assert {"afd_throughput.html", "afd_idle.html", "afd_ratio_table.html", "afd_trace_throughput.html",
            "afd_indep_throughput.html", "afd_gap_map.html"} <= set(out["_figures"])
