"""How the book shows exercises (issue 40): the student's blank, then the solution and the check collapsed, and
no check output that states the expected value; an index of chapters only; a page captured without a live
engine says so. Static: built from a small executed notebook, no Sphinx run."""

from __future__ import annotations

from moelab.book import _index, capture_note, prepare_notebook
from moelab.course import EXERCISES


def _executed() -> dict:
    ex = EXERCISES["00.distinct_experts"]
    feedback = ex.check(ex.solution(**ex.context), **ex.context)
    return {"metadata": {}, "nbformat": 4, "nbformat_minor": 5, "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": "# 00 — the map\n\n### Exercise"},
        {"cell_type": "code", "metadata": {"nbgrader": {"solution": True, "grade": False, "locked": False,
                                                        "grade_id": "a", "schema_version": 3},
                                           "jupyter": {"source_hidden": True}, "tags": ["hide-input"]},
         "source": "### BEGIN SOLUTION\nanswer = E * (1 - (1 - TOP_K / E) ** PREDICT_BATCH)\n### END SOLUTION\n",
         "outputs": [], "execution_count": 1},
        {"cell_type": "code", "metadata": {"nbgrader": {"solution": False, "grade": True, "locked": True,
                                                        "points": 1, "grade_id": "b", "schema_version": 3}},
         "source": 'require(EXERCISES["00.distinct_experts"].check(answer, **CTX))', "execution_count": 2,
         "outputs": [{"output_type": "display_data", "metadata": {},
                      "data": {"text/markdown": feedback._repr_markdown_(), "text/plain": str(feedback)}}]},
    ]}


def test_exercise_shows_the_blank_then_collapses_solution_and_check():
    page = prepare_notebook(_executed(), "00_overview", None)
    cells = page["cells"]
    kinds = [(c["cell_type"], c["metadata"].get("tags", [])) for c in cells]
    blank = next(i for i, (_, tags) in enumerate(kinds) if "exercise-blank" in tags)
    assert "YOUR CODE HERE" in cells[blank]["source"] and "answer = E" not in cells[blank]["source"]
    assert "hide-input" in kinds[blank + 1][1] and "hide-input" in kinds[blank + 2][1]  # solution, check
    shown = cells[blank + 2]["outputs"][0]["data"]["text/markdown"]
    assert shown.startswith("**Correct:**") and not any(ch.isdigit() for ch in shown.split("(")[0])
    assert "✅" not in str(page) and "❌" not in str(page)


def test_index_lists_chapters_only():
    index = _index(["00_overview", "course"], {"00_overview": "00 — the map", "course": "The course"})
    assert ":titlesonly:" in index and ":maxdepth: 1" in index


def test_a_page_captured_without_a_live_engine_is_labelled():
    executed = {"cells": [{"cell_type": "code", "metadata": {}, "source": "", "outputs": [
        {"output_type": "stream", "name": "stdout", "text": "capture backend: hf (vllm is not installed)\n"}]}]}
    assert "without a live vLLM engine" in capture_note(executed)
    page = prepare_notebook(executed, "06_from_your_deployment", None)
    assert "without a live vLLM engine" in page["cells"][1]["source"]
    live = {"cells": [{"cell_type": "code", "metadata": {}, "source": "", "outputs": [
        {"output_type": "stream", "name": "stdout", "text": "capture backend: vllm (vllm 0.32.0)\n"}]}]}
    assert capture_note(live) == ""


def test_a_page_run_on_the_recorded_capture_names_its_engine_and_date():
    executed = {"cells": [{"cell_type": "code", "metadata": {}, "source": "", "outputs": [
        {"output_type": "stream", "name": "stdout", "text": "capture backend: file (reading tiny-moe-06-vllm.npz)\n"},
        {"output_type": "stream", "name": "stdout", "text": ["trace recorded with vLLM 0.32.0 on 2026-12-06\n",
                                                             "30 requests (file)\n"]}]}]}
    note = capture_note(executed)
    assert "executed from a capture recorded with vLLM 0.32.0 on 2026-12-06, no live engine here" in note
    assert "data/traces/tiny-moe-06-vllm.npz" in note  # the bundled recording, named
    other = {"cells": [{"cell_type": "code", "metadata": {}, "source": "", "outputs": [
        {"output_type": "stream", "name": "stdout", "text": "capture backend: file (reading mine.npz)\n"}]}]}
    assert "recorded with an engine elsewhere" in capture_note(other) and "tiny-moe-06" not in capture_note(other)


def test_the_book_gives_06_the_recorded_capture_only_where_no_live_engine_is(monkeypatch):
    import moelab.models.vllm_engine as ve
    from moelab.book import RECORDED_CAPTURE, notebook_params, recorded_capture
    from moelab.traces import load_trace

    path = recorded_capture()
    assert path is not None and path.name == RECORDED_CAPTURE.name  # shipped in data/traces
    trace = load_trace(path)
    assert trace.provenance["backend"] == "vllm" and trace.provenance["versions"]["vllm"]
    assert trace.provenance["dtype"] == "float32" and len(set(trace.domains)) >= 2
    assert all(v for k, v in trace.provenance["hf_agreement"].items() if k.endswith("_equal"))
    assert path.stat().st_size < 200_000  # small: a few dozen requests
    monkeypatch.setattr(ve, "vllm_status", lambda features=("engine",): (False, "vLLM is not installed (hidden)"))
    assert notebook_params("06_from_your_deployment", {"PRESET": "ci"}) == {"PRESET": "ci", "TRACE": str(path)}
    assert notebook_params("06_from_your_deployment", {"BACKEND": "hf"}) == {"BACKEND": "hf"}  # asked for: kept
    assert notebook_params("00_overview", {}) == {}
    monkeypatch.setattr(ve, "vllm_status", lambda features=("engine",): (True, "vLLM 0.32.0"))
    assert notebook_params("06_from_your_deployment", {}) == {}  # a live engine: the page captures from it
