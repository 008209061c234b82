"""The DSD notebook runs headless with small parameters and records each proposition's check."""

from __future__ import annotations

import pytest

import moelab.dsd as dsd
from tests.helpers import execute_notebook
from tests.test_dsd import SPEC_TABLE


@pytest.mark.notebook
def test_dsd_notebook(tmp_path):
    out = execute_notebook("04_dsd_rtt", {"mc_rounds": 4000, "rounds_per_client": 100}, tmp_path)
    res = out["04_dsd_rtt"]
    for t_ar, row in SPEC_TABLE.items():
        for alpha, expected in row.items():
            assert res["breakeven_table"][str(t_ar)][f"{alpha:g}"] == expected
    assert res["colocated_beats_sync_everywhere"] is True
    assert res["mc_points"] == 28 and res["mc_max_abs_z"] < 4.0
    assert res["capacity_max_abs_rel_err_pct"] < 6.0
    assert all(row["dsd_clients"] > row["colocated_clients"] for row in res["capacity"])
    # with equal draft speeds co-located SD never loses to either DSD mode
    shares = res["region_shares"]["all_modes"]
    assert shares["dsd_sync"] == 0 and shares["dsd_pipelined"] == 0
    assert 0 < res["region_shares"]["no_colocation"]["dsd_pipelined"] < 1
    assert res["optimal_gamma"] == dsd.optimal_gamma(0.8, 10 / 50, 16)
    assert res["breakeven_at_point"] == pytest.approx(float(dsd.rtt_breakeven(0.8, 5, 50, 10)))
    assert {"dsd_breakeven_table.html", "dsd_latency_vs_rtt.html", "dsd_region_map.html",
            "dsd_capacity.html"} <= set(out["_figures"])
