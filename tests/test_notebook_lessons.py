"""Notebook-wide lesson checks over the committed notebooks (issue 26), static: no notebook is executed.

* No typed results in markdown: every digit must be explained by the allow-list of
  :func:`moelab.bench.notebooks.typed_numbers` (section numbers, labels, names such as H200 or
  SmolLM2-135M, model sizes, years, arXiv ids, notebook numbers, single-digit constants of a formula).
  Lesson notebooks have none. Notebooks NOT YET REWRITTEN AS LESSONS keep a recorded per-notebook
  baseline (:data:`TYPED_NUMBERS_BASELINE`) that MAY ONLY SHRINK: lower it when you remove typed
  numbers, never raise it; a notebook that becomes a lesson must reach zero.
* Every lesson notebook (one with exercises) has enough exercises, valid nbgrader metadata, hidden
  solutions, a ``parameters`` cell, a headline cell within the first 35% of its code cells, and shows
  every figure it saves; its check cells name registered exercises whose checkers accept the solution
  and reject a typical wrong answer with a message.
"""

from __future__ import annotations

import math
import re

import pytest

from moelab.bench import notebooks as nbs
from moelab.course import lessons

NOTEBOOKS = lessons.notebook_names()
# Notebooks rewritten as lessons (each must stay one).
EXPECTED_LESSONS = ("00_overview", "01_eldr", "02_hierarchy_drafting", "03_afd_ratio", "04_dsd_rtt",
                    "05_balanceroute", "06_from_your_deployment", "07_cross_paper")
# minimum exercises per lesson: 2 in the map (00) and the deployment notebook (06), 4 in every paper notebook
MIN_EXERCISES = {"00_overview": 2, "06_from_your_deployment": 2}
PAPER_MIN_EXERCISES = 4
# typed numbers in markdown per notebook not yet rewritten as a lesson: may only shrink (see the docstring)
TYPED_NUMBERS_BASELINE: dict[str, int] = {}
# figures saved but never displayed, per notebook not yet rewritten as a lesson (static; may only shrink)
UNSHOWN_BASELINE: dict[str, int] = {}

LOADED = {name: lessons.load_notebook(name) for name in NOTEBOOKS}
LESSONS = sorted(name for name, nb in LOADED.items() if lessons.is_lesson(nb))


@pytest.mark.parametrize("text, typed", [
    ("## Proposition 2 — the window\nPart 2 re-measures it (step 1).", []),
    ("SmolLM2-135M on an H200 (arXiv 2606.25091, 2026), see 04_dsd_rtt and [03](03_afd_ratio.ipynb).", []),
    ("1. first\n2. second item", []),
    ("Reproduction (sections 3.1–3.4) and propositions 2 and 3; an rA–1F bundle", []),
    (r"$(1-k/E)^B$ and $$1 - \frac{1-(1-p)^{n}}{p}$$ with $t_{12}$", []),
    (r"prompts $20\,\mu_P$ long", ["20"]),
    (r"$E = \frac{1 - \alpha^{\gamma + 1}}{1 - \alpha}$ and `dense_verify.csv`, M1, r_A, a 7B target", []),
    ("HD is 1.567x faster than AR", ["1.567x"]),
    ("the break-even RTT is 84 ms", ["84"]),
    (r"at $\alpha = 0.8$ the window is `gamma = 5` long", ["0.8", "5"]),
    ("within 0.5% of the mean", ["0.5%"]),
    ('<details><summary>x</summary><a href="https://example.org/2606.25091v2">paper</a></details>', []),
])
def test_typed_number_allow_list(text, typed):
    assert nbs.typed_numbers(text) == typed


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_no_new_typed_numbers_in_markdown(name):
    found = nbs.markdown_typed_numbers(LOADED[name])
    if name in LESSONS:
        assert found == [], f"{name} is a lesson: render these from the results instead of typing them: {found}"
    else:
        allowed = TYPED_NUMBERS_BASELINE.get(name, 0)
        assert len(found) <= allowed, (f"{name}: {len(found)} typed numbers in markdown, baseline {allowed} "
                                       f"(it may only shrink): {found}")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_saved_figure_is_displayed(name):
    unshown = nbs.unshown_figures(LOADED[name])
    allowed = 0 if name in LESSONS else UNSHOWN_BASELINE.get(name, 0)
    assert len(unshown) <= allowed, f"{name} saves figures it never displays (cell:variable): {unshown}"


def test_expected_lessons_are_lessons():
    assert set(EXPECTED_LESSONS) <= set(LESSONS), f"not lessons (no exercise cells): {set(EXPECTED_LESSONS) - set(LESSONS)}"


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_structure(name):
    nb = LOADED[name]
    need = MIN_EXERCISES.get(name, PAPER_MIN_EXERCISES)
    assert len(lessons.exercise_cells(nb)) >= need, f"{name}: fewer than {need} exercises"
    assert lessons.nbgrader_problems(nb) == []
    assert len(lessons.solution_cells(nb)) >= len(lessons.exercise_cells(nb)), f"{name}: an exercise without a solution"
    code = lessons.code_cells(nb)
    assert sum("parameters" in c.get("metadata", {}).get("tags", []) for c in code) == 1
    frac = nbs.first_result_cell_frac(nb)
    assert frac <= nbs.FIRST_RESULT_GOAL, f"{name}: headline cell at {frac:.2f} of the code cells"
    params = next(c for c in code if "parameters" in c["metadata"].get("tags", []))
    names = re.findall(r"^([A-Za-z_]\w*)\s*=", "".join(params["source"]), flags=re.MULTILINE)
    assert names and all(n.isupper() for n in names), f"{name}: parameters must be UPPERCASE: {names}"
    assert "INTERACTIVE" in names or not any("panel" in "".join(c["source"]) for c in code)


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_check_cells_name_registered_exercises(name):
    registry = nbs.import_course_modules()
    cells = lessons.code_cells(LOADED[name])
    for i, cell in enumerate(cells):
        if cell not in lessons.exercise_cells(LOADED[name]):
            continue
        keys = re.findall(r'EXERCISES\["([^"]+)"\]', "".join(cell["source"]))
        assert len(keys) == 1 and keys[0] in registry, f"{name}: check cell {i} names {keys}"
        assert "require(" in "".join(cell["source"])
        previous = cells[i - 1]
        assert previous.get("metadata", {}).get("nbgrader", {}).get("solution") is True, \
            f"{name}: check cell {i} does not follow its solution cell"


def test_every_checker_accepts_its_solution_and_rejects_a_wrong_answer():
    verdicts = nbs.checker_verdicts()
    assert verdicts and all(verdicts.values()), [k for k, ok in verdicts.items() if not ok]


@pytest.mark.parametrize("key", sorted(k for k in nbs.import_course_modules() if k.startswith("04.")))
@pytest.mark.parametrize("bad", ["abc", None, math.nan, [1.0, 2.0], {"a": 1}])
def test_dsd_checkers_answer_bad_input_with_a_message(key, bad):
    ex = nbs.import_course_modules()[key]
    feedback = ex.check(bad, **ex.context)
    assert not feedback.ok and len(feedback.message) > 20


def test_bench_suite_prints_the_stable_names():
    names = {f.name for f in nbs.run(quick=True)}
    assert {"lesson_exercises_total", "lesson_checkers_reject_wrong", "notebook_typed_numbers",
            "notebook_figures_unshown"} <= names
    assert {f"notebook_first_result_cell_frac_{n}" for n in NOTEBOOKS} <= names


def test_book_figure_reports_a_failed_build_as_nan_with_the_reason(tmp_path):
    """``book_build_seconds`` of a build that cannot happen (the site path is a file) is NaN, and the note names
    the reason, so the bench table shows a failure instead of a time."""
    site = tmp_path / "site"
    site.write_text("a file, not a folder")
    fig = nbs.book_figure(tmp_path / "runs", site)
    assert fig.name == "book_build_seconds" and fig.value != fig.value
    assert fig.note.startswith("FAILED") and "is a file" in fig.note


def test_runner_finds_exactly_the_shown_figures(tmp_path, monkeypatch):
    """tests/helpers.py's check: a figure saved and displayed is found by its layout.meta stamp in the
    outputs (plotly JSON or an HTML renderer's escaped copy); one saved and not displayed is reported."""
    import json

    import plotly.graph_objects as go

    from moelab.viz import save_figure
    from tests.helpers import shown_figures, unshown_figures

    monkeypatch.setenv("MOELAB_PNG", "0")
    shown, hidden, as_html = (go.Figure(go.Scatter(x=[1], y=[2])) for _ in range(3))
    for fig, name in ((shown, "shown_one"), (hidden, "hidden_one"), (as_html, "html_one")):
        save_figure(fig, name, tmp_path)
    executed = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "data": {"application/vnd.plotly.v1+json": shown.to_plotly_json()}},
        {"output_type": "display_data", "data": {"text/html": as_html.to_html(include_plotlyjs=False)}}]}],
        "metadata": {}}
    path = tmp_path / "executed.ipynb"
    path.write_text(json.dumps(executed))
    assert shown_figures(executed) == {"shown_one", "html_one"}
    assert unshown_figures("99_example", tmp_path, path) == ["hidden_one"]
