"""The AFD notebook runs headless with small parameters, teaches before it measures, and records both the
reproduction and the test."""

from __future__ import annotations

import json
import re

import pytest

import moelab.afd as afd
from moelab.course.agreement import assert_reads_cleanly
from moelab.datasets import repo_root
from moelab.presets import preset_values
from tests.helpers import execute_notebook

# the "ci" preset (sizes in moelab/presets.py), also the browser test's (tests/test_browser.py reads CI_PARAMS and
# turns the panels on)
CI_PARAMS = {"PRESET": "ci", "INTERACTIVE": False}
CI = preset_values("03_afd_ratio", "ci")
NOTEBOOK = repo_root() / "notebooks" / "03_afd_ratio.ipynb"


def _cells():
    return json.loads(NOTEBOOK.read_text())["cells"]


def test_lesson_structure_and_nbgrader_metadata():
    cells = _cells()
    code = [c for c in cells if c["cell_type"] == "code"]
    assert all(not c["outputs"] and c["execution_count"] is None for c in code), "commit the notebook without outputs"
    text = ["".join(c["source"]) for c in cells]
    # the mechanism (LaTeX) and the worked example come before the first measurement
    first_sim = next(i for i, t in enumerate(text) if "simulated_optimum(" in t)
    assert any("$$" in t and "r^*" in t for t in text[:first_sim])
    assert any("worked_row(" in t for t in text[:first_sim]) and any("MY_GUESS" in t for t in text[:first_sim])
    # the headline within the first third of the code cells
    headline = next(i for i, c in enumerate(code) if "throughput_figure(" in "".join(c["source"]))
    assert headline / len(code) <= 0.35
    # exercises: a solution cell with nbgrader markers and metadata, then a locked check cell
    solutions = [c for c in code if "### BEGIN SOLUTION" in "".join(c["source"])]
    assert len(solutions) >= 4
    for c in solutions:
        nb = c["metadata"]["nbgrader"]
        assert nb["solution"] and not nb["grade"] and not nb["locked"] and nb["schema_version"] == 3
        assert c["metadata"]["jupyter"]["source_hidden"] and "hide-input" in c["metadata"]["tags"]
        assert "### END SOLUTION" in "".join(c["source"])
    checks = [c for c in code if "require(EXERCISES[" in "".join(c["source"])]
    assert len(checks) == len(solutions)
    for c in checks:
        nb = c["metadata"]["nbgrader"]
        assert nb["grade"] and nb["locked"] and nb["points"] > 0 and not nb["solution"] and nb["schema_version"] == 3
    ids = [c["metadata"]["nbgrader"]["grade_id"] for c in solutions + checks]
    assert len(ids) == len(set(ids))
    # one symbol, one meaning: AFD's cycle time is t_cyc, tau is ELDR's band
    assert not any("\\tau" in t and "not the paper's" not in t for t in text if t)
    assert "NOTATION.md" in text[0] and "04_dsd_rtt.ipynb" in text[-1]
    # one meaning for the horizon N: requests served by one microbatch's B slots, the unit K = N/(B p) counts
    # steps in (tenth read: it was called "requests per attention instance", which holds three microbatches)
    sources = text + [(repo_root() / "moelab" / f).read_text() for f in ("viz/afd.py", "afd/theory.py")]
    loose = [m.group(0) for t in sources
             for m in re.finditer(r"requests (?:served )?per (?:attention )?instance(?! and microbatch)[^\n]{0,40}", t)]
    assert not loose, loose
    # r_peak is where the FFN-bound throughput peaks, not a balance of stage times (twelfth read)
    assert not any("Setting stage times equal gives three candidates" in t for t in text)


@pytest.mark.notebook
def test_afd_notebook(tmp_path):
    out = execute_notebook("03_afd_ratio", CI_PARAMS, tmp_path)
    # issue 40: every number its prose states agrees with its results or tables, and its figures read cleanly
    assert_reads_cleanly(tmp_path / "03_afd_ratio.ipynb", out)
    res = out["03_afd_ratio"]
    assert len(res["check_values"]) == 5 and res["check_max_abs_err"] <= 0.1
    assert res["r_star"] == pytest.approx(afd.optimal_ratio(256, 100, 500, N=CI["N"]))
    assert res["worked_example"][0]["r*"] == pytest.approx(res["r_star"])
    assert res["predict_long_prompt"]["r_star"] == pytest.approx(afd.optimal_ratio(256, 2000, 500, N=CI["N"]))
    assert len(res["ratio_table"]) == 36
    ind = res["indep"]
    # the independent simulation: recorded as measured, with its fit errors and extrapolation counts
    assert ind["lengths"] == "azure-conv" and 32 in ind["r_values"] and ind["sim_le_stage_bound"]
    assert {e["stage"] for e in ind["fit_errors"]} == {"attention", "ffn", "link"}
    assert ind["coverage"]["ffn_extrapolated"] > 0 and ind["coverage"]["notes"]
    assert ind["gap_pct"] == pytest.approx(100 * (ind["r_sim"] - ind["r_star"]) / ind["r_star"])
    cells = len(CI["MAP_B"]) * len(CI["MAP_MU_P"]) * len(CI["MAP_MU_D"]) * len(CI["MAP_DISTRIBUTIONS"])
    assert len(res["gap_map"]) == cells and {r["lengths"] for r in res["gap_map"]} == set(CI["MAP_DISTRIBUTIONS"])
    assert {"r32_gap_pct", "b128", "verdict"} <= set(res)
    assert len(res["verdict"]) == 5 and all(isinstance(v["holds"], bool) for v in res["verdict"])
    assert 0 <= res["gap_map_integer_agreement"] <= 1
    assert res["trace"]["name"] == "azure-2023-conv" and res["trace"]["requests"] > 10_000
    # what is projection is said per r, and the two r* of sections 3.4 and 3.5 are reconciled row by row
    assert ind["ffn_projected_r"] == [r for r in ind["r_values"] if r * 256 > ind["ffn_table_max_batch"]]
    rows = res["reconcile"]["rows"]
    assert rows[0]["r_star"] == pytest.approx(res["trace"]["r_star"]) and rows[-1]["r_star"] == pytest.approx(ind["r_star"])
    assert sum(res["gap_map_regimes"]["cells"].values()) == len(res["gap_map"])
    assert {"afd_bundle.html", "afd_throughput.html", "afd_idle.html", "afd_ratio_table.html",
            "afd_trace_throughput.html", "afd_indep_throughput.html", "afd_gap_map.html"} <= set(out["_figures"])
    # every figure saved is also shown: each saved title appears in a plotly output of the executed notebook
    shown = [o["data"]["application/vnd.plotly.v1+json"]["layout"].get("title", {}).get("text", "")
             for c in json.loads((tmp_path / "03_afd_ratio.ipynb").read_text())["cells"] if c["cell_type"] == "code"
             for o in c.get("outputs", []) if "application/vnd.plotly.v1+json" in o.get("data", {})]
    saved = [f for f in out["_figures"] if f.endswith(".html")]
    assert len(shown) >= len(saved), (shown, saved)
    # issue 40's student read: the simulated idle curves are read where they cross (both sides idle: stragglers),
    # a gap under 0.05% is not printed as "-0.0%", and the horizon is per attention instance, not per "slot group"
    text = _executed_text(tmp_path / "03_afd_ratio.ipynb")
    idle = res["idle_at_sim_crossing"]
    assert set(idle) == {"attention", "ffn"} and all(0 <= v <= 1 for v in idle.values())
    assert f"the attention instances idle {idle['attention']:.1%} of the time and the FFN {idle['ffn']:.1%}" in text
    assert "-0.0%" not in text and "slot group" not in text
    # third read: the idle figure's title is true of its series (the old one said neither side waits at the crossing),
    # B is one microbatch's slots, and the coverage table labels totals and extrapolated counts apart
    from moelab.viz.afd import IDLE_WAIT_SHARE
    idle_title = next(t for t in shown if t.startswith("Idle share of each side"))
    assert "neither waits" not in idle_title and "theory crosses at zero idle" in idle_title
    assert ("both still wait" in idle_title) == (min(idle.values()) >= IDLE_WAIT_SHARE)
    assert "each with $B$ request slots" not in text and "extrapolated evaluations" not in text
    assert "moe_step" not in text and "(B <=" not in text
    assert f"a slot holds {ind['load_ratio']:.2f}x (mu_P + mu_D)" in text  # the take-aways' load ratio, shown in 3.5
    # second read: the take-away splits that ratio into its prompt and decode parts instead of naming one cause
    parts = ind["load_parts"]
    assert parts["prompt"] + parts["decode"] == pytest.approx(ind["load_ratio"] * (ind["mu_P"] + ind["mu_D"]))
    assert f"its prompt averages {parts['prompt_ratio']:.2f}x mu_P" in text
    assert f"its decoded part {parts['decode_ratio']:.2f}x mu_D" in text
    # sixth read: "below the turn the simulation runs below theory" while r = 1 ran above it; the rows below the
    # straggler turn that run at or above theory are recorded and named
    st = res["straggler"]
    if st["crossing"] is not None:
        above = [row["r"] for row in res["sweep"]
                 if row["r"] < st["crossing"] and row["sim_throughput"] >= row["theory_throughput"]]
        assert [o["r"] for o in st["above_theory_below_turn"]] == above
        for r in above:
            assert (f"at r = {r} it runs above theory" in text
                    or f"Below the turn, at r = {r}, the simulation runs above theory" in text), r
        below = [row["r"] for row in res["sweep"] if row["r"] < st["crossing"] and row["r"] not in above]
        assert st["below_theory_r"] == below
    # the sub-integer estimate is defined where it is first stated, and its gap is signed like the integer one
    assert "**sub-integer estimate** is the peak of the parabola" in text
    assert res["interp_gap_signed_pct"] == pytest.approx(100 * (res["r_sim_interp"] - res["r_star"]) / res["r_star"])
    # the B = 128 row sets two workloads side by side: both are named, both gaps signed, no unbacked "furthest"
    b128 = res["b128"]
    assert "**Which workload each column is.**" in text and "furthest from" not in text
    assert b128["paper_mode_gap_pct"] == pytest.approx(
        100 * (b128["paper_mode_r_sim"] - b128["paper_mode_r_star"]) / b128["paper_mode_r_star"])
    assert f"has r\\* = {b128['r_star']:.2f}, set by" in text
    # seventh read: the closed form gets each distribution's sampled means, so "the same Tbar" was not what its
    # token_load column showed; the spread it states is the map's own
    assert "same Tbar (it depends on the means only)" not in text + NOTEBOOK.read_text()
    if res["gap_map_moved"]:
        spread = res["gap_map_closed_form_spread_pct"]
        loads = {}
        for row in res["gap_map"]:
            loads.setdefault((row["B"], row["mu_P"], row["mu_D"]), []).append(row["token_load"])
        assert spread["token_load"] == pytest.approx(max(100 * (max(v) - min(v)) / min(v) for v in loads.values()))
        assert f"differ by at most {spread['token_load']:.2g}% (`token_load`)" in text


def _executed_text(path):
    """Every markdown cell, markdown output and printed line of an executed notebook, joined."""
    parts = []
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            parts.append("".join(cell["source"]))
        for o in cell.get("outputs", []):
            parts.append("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/markdown", "")))
    return "\n".join(parts)


def test_classroom_gap_map_reaches_both_regimes():
    """The map students see is not one regime everywhere: its axes reach the FFN peak and attention balance (the
    closed form with the coefficients the map fits, at the declared means)."""
    room = preset_values("03_afd_ratio", "classroom")
    regimes = {afd.ratio_terms(b, p, d, room["MAP_REQUESTS"], afd.coefficients_from_tables("h200", B=b)).binding
               for b in room["MAP_B"] for p in room["MAP_MU_P"] for d in room["MAP_MU_D"]}
    assert {"ffn_peak", "attention"} <= regimes
