"""The overview notebook is the map: it draws the decode step as a sum of terms, asks the distinct-experts
question before it reveals the answer, checks its exercises, runs headless and records the MoE-layer fact."""

from __future__ import annotations

import json

import pytest

from moelab.costmodel import MODEL_SHAPES, expected_distinct_experts
from moelab.course.agreement import assert_reads_cleanly
from moelab.datasets import repo_root
from tests.helpers import execute_notebook

NOTEBOOK = repo_root() / "notebooks" / "00_overview.ipynb"


def test_map_structure_links_and_nbgrader_metadata():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert all(not c["outputs"] and c["execution_count"] is None for c in code), "commit the notebook without outputs"
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for name in ("01_eldr", "02_hierarchy_drafting", "03_afd_ratio", "04_dsd_rtt", "05_balanceroute",
                 "06_from_your_deployment", "07_cross_paper"):
        assert f"]({name}.ipynb)" in text, f"no link to {name}"
    assert "](NOTATION.md" in text and "D = E" in text
    # predict, then reveal; and the labelled map (which paper moves which term) only after exercise 2, which asks
    # for one of its labels, has been checked (issue 40: the book gives nothing away)
    order = ["MY_GUESS = None", "expected_distinct_experts(PREDICT_BATCH", 'EXERCISES["00.paper_for_term"]',
             "decode_step_figure()"]
    first = [next(i for i, c in enumerate(code) if key in "".join(c["source"])) for key in order]
    assert first == sorted(first)
    # the question says which cells to run before guessing (twelfth read: "before running the next two cells"
    # skipped the cell that prints E and k)
    guess = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith("MY_GUESS = None"))
    question = next("".join(c["source"]) for c in reversed(cells[:guess]) if c["cell_type"] == "markdown")
    assert "next two cells" not in question and "Run the cell below" in question
    before = "\n".join("".join(c["source"]) for c in cells[:cells.index(code[first[2]])])
    assert "DECODE_TERMS" in before and "lab_map()" not in before, "exercise 2 must not follow the labelled map"
    solutions = [c for c in code if "### BEGIN SOLUTION" in "".join(c["source"])]
    checks = [c for c in code if "require(EXERCISES[" in "".join(c["source"])]
    assert len(solutions) >= 2 and len(checks) == len(solutions)
    for c in solutions:
        assert c["metadata"]["nbgrader"]["solution"] and c["metadata"]["jupyter"]["source_hidden"]
        assert "hide-input" in c["metadata"]["tags"]
    for c in checks:
        assert c["metadata"]["nbgrader"]["grade"] and c["metadata"]["nbgrader"]["locked"]


@pytest.mark.notebook
def test_overview_notebook(tmp_path):
    out = execute_notebook("00_overview", {"PRESET": "ci"}, tmp_path)
    # issue 40: every number its prose states agrees with its results or tables, and its figures read cleanly
    assert_reads_cleanly(tmp_path / "00_overview.ipynb", out)
    res = out["00_overview"]
    assert res["notebooks"] == ["01_eldr", "02_hierarchy_drafting", "03_afd_ratio", "04_dsd_rtt",
                                "05_balanceroute", "07_cross_paper", "06_from_your_deployment"]
    assert res["reading_order"][0] == "00_overview" and set(res["reading_order"][1:]) == set(res["notebooks"])
    shape = MODEL_SHAPES["qwen3-30b-a3b"].moe
    d = res["distinct_experts"]
    assert d["D"] == pytest.approx(float(expected_distinct_experts(32, shape.num_experts, shape.top_k)))
    assert d["D"] < min(shape.num_experts, shape.top_k * 32)
    # the guess needs E and k: they are shown before the MY_GUESS cell (tenth read: only the reveal printed them)
    cells = json.loads((tmp_path / "00_overview.ipynb").read_text())["cells"]
    guess = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith("MY_GUESS = None"))
    before = json.dumps([o for c in cells[:guess] for o in c.get("outputs", [])])
    assert f"$E$ = {shape.num_experts} experts" in before and f"top $k$ = {shape.top_k}" in before
    # the no-overlap reference is the figure's grey line, min(E, k·B): 128 of a 128-expert layer, not k·B = 256
    assert d["no_overlap"] == min(shape.num_experts, shape.top_k * 32)
    qwen = res["moe_layer"]["qwen3-30b-a3b"]
    # the measured headline of the calibration README: 47 us at D=8 vs 308 us at D=128
    assert (qwen["D_min"], qwen["D_max"]) == (8, 128)
    assert res["batches_with_one_D_per_shape"] == [1]  # one token reads exactly its top-k: no slope at B = 1
    assert qwen["us_at_D_min"] == pytest.approx(47.3, abs=0.5)
    assert qwen["us_at_D_max"] == pytest.approx(308.1, abs=0.5)
    # the fitted model reproduces the growth with distinct experts
    assert qwen["fitted_ratio"] == pytest.approx(qwen["measured_ratio"], rel=0.15)
    assert all(s["measured_ratio"] > 1.5 for s in res["moe_layer"].values())
    assert res["fit_median_abs_err_pct"] < 10
    assert {"overview_lab_map.html", "overview_moe_time_vs_experts.html", "overview_decode_step.html",
            "overview_distinct_experts.html"} <= set(out["_figures"])
    # every figure saved is also shown: each saved title appears in a plotly output of the executed notebook
    shown = [o["data"]["application/vnd.plotly.v1+json"]["layout"].get("title", {}).get("text", "")
             for c in json.loads((tmp_path / "00_overview.ipynb").read_text())["cells"] if c["cell_type"] == "code"
             for o in c.get("outputs", []) if "application/vnd.plotly.v1+json" in o.get("data", {})]
    saved = [f for f in out["_figures"] if f.endswith(".html")]
    assert len(shown) >= len(saved), (shown, saved)
    # the ratio is read for what it compares (a student read 6.5x as a step-time gap between realistic batches):
    # the floor D = k is forced, D_max is what random routing of B tokens touches, the slope is what carries over
    reading = res["moe_layer_reading"]
    assert reading["D_min"] == shape.top_k and reading["D_random"] == pytest.approx(reading["D_max"], abs=0.5)
    assert reading["D_half"] == 64 and 0 < reading["half_saving_pct"] < 100 * (1 - 1 / reading["measured_ratio"])
    text = "\n".join("".join(o["data"]["text/markdown"])
                     for c in json.loads((tmp_path / "00_overview.ipynb").read_text())["cells"]
                     for o in c.get("outputs", []) if "text/markdown" in o.get("data", {}))
    assert "not the decode step" in text and "several-fold in step time" not in text
    assert f"not the {d['no_overlap']} it would touch if no two tokens shared one" in text


def test_moe_layer_reading_reads_the_measured_points():
    import pandas as pd  # lazy: only this test builds a points frame

    from moelab.viz.overview import moe_layer_reading  # lazy: the module imports plotly and ipywidgets

    pts = pd.DataFrame({"model": "qwen3-30b-a3b", "D": [8, 16, 64, 128], "ms_per_layer": [0.05, 0.07, 0.17, 0.31]})
    r = moe_layer_reading(pts, "qwen3-30b-a3b", 256)
    assert (r["D_min"], r["D_max"], r["D_half"]) == (8, 128, 64)
    assert r["us_at_D_half"] == pytest.approx(170.0) and r["half_saving_pct"] == pytest.approx(100 * (1 - 17 / 31))
    assert r["measured_ratio"] == pytest.approx(6.2) and r["us_per_expert"] > 0
    assert r["D_random"] == pytest.approx(float(expected_distinct_experts(256, 128, 8)))
    with pytest.raises(ValueError, match="two measured"):
        moe_layer_reading(pts.head(1), "qwen3-30b-a3b", 256)
    with pytest.raises(ValueError, match="model must be one of"):
        moe_layer_reading(pts, "no-such-model", 256)


def test_decode_step_figure_captions_every_term_it_names():
    """Every term of the decode-step sum carries a caption: the five boxed ones name the paper that moves them, and
    t_link, which no paper moves, says so (a student read 'each term labelled with the paper whose method moves it'
    under a figure where t_link had no label at all)."""
    from moelab.viz.overview import DECODE_TERMS, UNMOVED_TERM, decode_step_figure  # lazy: imports plotly

    captions = [a.text for a in decode_step_figure().layout.annotations if "notebook" in (a.text or "")]
    assert len(captions) == len(DECODE_TERMS) + 1
    for row in DECODE_TERMS:
        assert sum(f"<b>{row['paper']}</b>" in c for c in captions) == 1, row["paper"]
    link = [c for c in captions if c.startswith(f"<b>{UNMOVED_TERM['paper']}</b>")]
    assert len(link) == 1 and "r_C" in link[0] and link[0].endswith("notebook 03")
    text = "\n".join("".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "markdown")
    assert "each boxed term labelled" in text and "One term has no box" in text
    # 'waits' means 'sits idle' in this lab (03: 'too few attention instances and the FFN waits'); at r* >= r_C the
    # link is faster than the FFN, so r_C keeps the link from being the stage the others wait for, not 'the stage
    # that waits' (a sixth student read)
    flat, caption = " ".join(text.split()), " ".join(link[0].replace("<br>", " ").split())
    for words in (flat, caption):
        assert "stage that waits" not in words and "from being the stage the others wait for" in words
    # the figure writes the MoE term as the prose does, with the rank's distinct experts D_g
    assert "t_{\\mathrm{MoE}}(D_g)" in text
    assert "t_MoE(D_g)" in [a.text for a in decode_step_figure().layout.annotations]
