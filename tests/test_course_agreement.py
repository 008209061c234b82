"""The prose-number cross-check (moelab.course.agreement) on made-up executed notebooks: a number the prose
states agrees when the results or a shown table hold it within its printed rounding (a fraction printed as a
percentage too); a typed or differently sourced number is a mismatch; math, inline code, small counts, years and
the checkers' feedback are not prose numbers. The real notebooks are checked on the executions
tests/test_notebook_*.py already make."""

from __future__ import annotations

from moelab.course.agreement import agrees, executed_report, prose_mismatches, prose_numbers


def _nb(*markdowns: str, table: str = "", check: str = "") -> dict:
    cells = [{"cell_type": "code", "metadata": {}, "source": "", "outputs": [
        {"output_type": "display_data", "data": {"text/markdown": md}}]} for md in markdowns]
    if table:
        cells.append({"cell_type": "code", "metadata": {}, "source": "", "outputs": [
            {"output_type": "execute_result", "data": {"text/plain": table}}]})
    if check:
        cells.append({"cell_type": "code", "metadata": {"nbgrader": {"grade": True, "locked": True}}, "source": "",
                      "outputs": [{"output_type": "display_data", "data": {"text/markdown": check}}]})
    return {"cells": cells}


def test_numbers_from_the_results_or_a_table_agree_within_rounding():
    results = {"r_star": 3.5408, "share": 0.4217, "runs": {"tokens": 137223.4}}
    nb = _nb("r* is **3.54** and 42% of the experts; Tbar 137,223 tokens.", "the table says 12.75 ms",
             table="  metric  value\n0  t_step  12.754")
    assert prose_mismatches(nb, results) == []


def test_a_typed_or_differently_sourced_number_is_a_mismatch():
    nb = _nb("the gain is 0.88% at G = 8 and r* = 3.61")
    found = {n.text for n in prose_mismatches(nb, {"gain_pct": 0.97, "r_star": 3.5408})}
    assert found == {"0.88", "3.61"}


def test_what_is_not_a_prose_number():
    nb = _nb("$t_{12} = 0.797$ in math, `BUDGET + 17` in code, 3 workers, the year 2023, an H200 and Qwen3-30B",
             check="**Correct:** is right (within rtol=0.005).")
    assert prose_numbers(nb) == []


def test_signs_and_absolute_values():
    nb = _nb("ELDR alone gains -7.2%, i.e. it loses 7.2%")
    assert prose_mismatches(nb, {"eldr_only_gain_pct": -7.213}) == []
    number = prose_numbers(_nb("+9.1 points"))[0]
    assert number.value == 9.1 and number.decimals == 1
    assert agrees(number, [9.14]) and not agrees(number, [9.2])


def test_executed_report_names_every_kind():
    report = executed_report(_nb("fine"), {})
    assert set(report) == {"prose_numbers_mismatched", "figure_text_entities", "figure_label_overlaps",
                           "figure_method_colors", "figure_log_axis_ticks", "figure_hidden_series",
                           "figure_title_overflows", "figure_table_cells_cut", "output_raw_entities",
                           "output_stray_values", "output_missing_markers"}
    assert not any(report.values())


def test_missing_value_markers_in_a_table_are_reported():
    from moelab.viz.hygiene import output_missing_markers

    def cell(html):
        return {"cell_type": "code", "outputs": [{"output_type": "display_data", "data": {"text/html": html}}]}

    nb = {"cells": [cell("<td>NaN</td><td>&lt;NA&gt;</td>"), cell("<td>—</td><td>None of these</td>"),
                    cell("<td>None</td>")]}
    assert [p.split(":")[0] for p in output_missing_markers(nb)] == ["cell 0", "cell 2"]


def test_a_returned_path_shown_as_a_cells_value_is_reported():
    from moelab.viz.hygiene import output_stray_values

    def cell(text, kind="execute_result", **data):
        return {"cell_type": "code", "outputs": [{"output_type": kind, "data": {"text/plain": text, **data}}]}

    nb = {"cells": [cell("PosixPath('/tmp/bkruns10/figures/03_afd_ratio.json')"), cell("2.5"),
                    cell("PosixPath('/x')", kind="display_data"), cell("Path('/x')", **{"text/html": "<b>x</b>"})]}
    assert [p.split(":")[0] for p in output_stray_values(nb)] == ["cell 0"]
