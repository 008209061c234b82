"""Figure hygiene (issue 40): the checks of moelab.viz.hygiene find what they should on small made-up figures,
and every lesson diagram the viz modules draw without data passes them. The figures the notebooks draw from data
are checked on the executions tests/test_notebook_*.py already make (moelab.course.agreement.assert_reads_cleanly)."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from moelab.viz import afd as afdviz
from moelab.viz import diagrams as d
from moelab.viz import overview as ov
from moelab.viz.hygiene import (
    MIN_COLOR_DELTA_E,
    delta_e,
    delta_e2000,
    figure_problems,
    hidden_series,
    label_overlaps,
    log_axis_ticks,
    method_colors,
    notebook_figure_problems,
    output_raw_entities,
    text_entities,
)

DIAGRAMS = {
    "eldr_tier": d.eldr_tier_diagram, "hd_walk": d.hd_walk_diagram, "dsd_timeline": d.dsd_timeline_diagram,
    "dp_barrier": d.dp_barrier_diagram, "two_level": d.two_level_routing_diagram, "decode_step": ov.decode_step_figure,
    "lab_map": ov.lab_map_figure, "afd_bundle": afdviz.bundle_diagram,
    "distinct_experts": lambda: ov.distinct_experts_figure(128, 8, 32, guess=40.0),
}


@pytest.mark.parametrize("name", sorted(DIAGRAMS))
def test_every_lesson_diagram_reads_cleanly(name):
    problems = figure_problems(DIAGRAMS[name]())
    assert not any(problems.values()), problems


@pytest.mark.parametrize("n_prefill,n_decode,routed", [(1, 1, 0), (6, 8, 0), (6, 8, 4), (3, 5, 4)])
def test_eldr_tier_diagram_reads_cleanly_at_other_sizes(n_prefill, n_decode, routed):
    problems = figure_problems(d.eldr_tier_diagram(n_prefill, n_decode, routed))
    assert not any(problems.values()), problems


@pytest.mark.parametrize("instances,ranks,rank", [(1, 1, 0), (6, 8, 7)])
def test_two_level_diagram_reads_cleanly_at_other_sizes(instances, ranks, rank):
    assert not any(figure_problems(d.two_level_routing_diagram(instances, ranks, 0, rank)).values())


def test_entities_and_unrendered_tags_are_found_plotly_markup_is_not():
    fig = go.Figure(go.Scatter(x=[1], y=[1], name="a &amp; b", hovertemplate="%{x}<extra></extra>"))
    fig.update_layout(title="x &ge; y<br><b>bold</b> <sub>k</sub>", xaxis_title="it&#x27;s")
    fig.add_annotation(x=1, y=1, text="<div>block</div> fine<br>line")
    found = text_entities(fig.to_plotly_json())
    flagged = {p.split("HTML ", 1)[1].split(" in ", 1)[0] for p in found}
    assert {"entity '&amp;'", "entity '&ge;'", "entity '&#x27;'", "tag '<div>'", "tag '</div>'"} == flagged


def test_overlapping_annotations_and_arrows_through_labels_are_found():
    fig = go.Figure()
    fig.update_xaxes(range=[0, 10], visible=False)
    fig.update_yaxes(range=[0, 10], visible=False)
    fig.add_annotation(x=5, y=5, text="a long label in the middle", showarrow=False)
    fig.add_annotation(x=5.5, y=5.1, text="another long label", showarrow=False)
    fig.add_annotation(x=1, y=9, text="far away", showarrow=False)
    found = label_overlaps(fig.to_plotly_json())
    assert len(found) == 1 and "overlap" in found[0]
    fig = go.Figure()
    fig.update_xaxes(range=[0, 10])
    fig.update_yaxes(range=[0, 10])
    fig.add_annotation(x=5, y=5, text="in the way", showarrow=False)
    fig.add_annotation(x=9, y=5, ax=1, ay=5, xref="x", yref="y", axref="x", ayref="y", text="", showarrow=True)
    assert any("runs through" in p for p in label_overlaps(fig.to_plotly_json()))
    fig.layout.annotations[0].update(y=8)  # moved above the arrow: clean
    assert label_overlaps(fig.to_plotly_json()) == []
    # a label drawn right after its arrow, on its shaft, is the arrow's own (moelab's diagrams label arrows so)
    own = go.Figure()
    own.update_xaxes(range=[0, 10])
    own.update_yaxes(range=[0, 10])
    own.add_annotation(x=9, y=5, ax=1, ay=5, xref="x", yref="y", axref="x", ayref="y", text="", showarrow=True)
    own.add_annotation(x=5, y=5, text="its label", showarrow=False, yshift=9)
    assert label_overlaps(own.to_plotly_json()) == []


def test_near_identical_method_colours_are_found_groups_and_subplots_are_not():
    fig = go.Figure([go.Bar(x=[1], y=[1], name="HD (paper, fixed)", marker_color="#5254a3"),
                     go.Bar(x=[1], y=[2], name="vLLM ngram", marker_color="#5558a8"),
                     go.Bar(x=[1], y=[3], name="AR", marker_color="#7f7f7f")])
    found = method_colors(fig.to_plotly_json())
    assert len(found) == 1 and "HD (paper, fixed)" in found[0] and "vLLM ngram" in found[0]
    grouped = go.Figure([go.Scatter(x=[1], y=[1], name="q (fit)", line_color="#1f77b4", legendgroup="q"),
                         go.Scatter(x=[1], y=[1], name="q (measured)", marker_color="#1f77b4", legendgroup="q")])
    assert method_colors(grouped.to_plotly_json()) == []
    assert delta_e("#000000", "#ffffff") > 99 and delta_e("#1f77b4", "#1f77b4") == 0 and delta_e("red", "#fff") is None
    # issue 40: two reds CIE76 lets through (20.8 apart) are near-identical to a reader; CIEDE2000 finds them (11.7)
    reds = go.Figure([go.Scatter(x=[1], y=[1], name="br0", line_color="#d62728"),
                      go.Scatter(x=[1], y=[2], name="vllm_dp@0.32", line_color="#d94801")])
    assert delta_e("#d62728", "#d94801") > MIN_COLOR_DELTA_E
    found = method_colors(reds.to_plotly_json())
    assert len(found) == 1 and "CIEDE2000" in found[0] and "br0" in found[0]
    # a red and an orange the lab draws side by side stay apart in both
    assert method_colors(go.Figure([go.Scatter(x=[1], y=[1], name="eldr", line_color="#d62728"),
                                    go.Scatter(x=[1], y=[2], name="vllm", line_color="#ff7f0e")]).to_plotly_json()) == []


def test_ciede2000_matches_the_published_reference():
    from moelab.viz.hygiene import _ciede2000

    # Sharma, Wu and Dalal (2005), Table 1: pairs 1, 7, 17, 25 and 34 (CIELAB) and their CIEDE2000
    for lab1, lab2, want in (((50, 2.6772, -79.7751), (50, 0, -82.7485), 2.0425),
                             ((50, 0, 0), (50, -1, 2), 2.3669),
                             ((50, 2.5, 0), (73, 25, -18), 27.1492),
                             ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387), 1.2644),
                             ((2.0776, 0.0795, -1.1350), (0.9033, -0.0636, -0.5514), 0.9082)):
        assert abs(_ciede2000(lab1, lab2) - want) < 1e-4, (lab1, lab2)
    assert abs(delta_e2000("#000000", "#ffffff") - 100.0) < 1e-3
    assert delta_e2000("#1f77b4", "#1f77b4") == 0 and delta_e2000("red", "#fff") is None
    for a, b in (("#d62728", "#d94801"), ("#1f77b4", "#393b79"), ("#7f7f7f", "#9467bd")):
        assert abs(delta_e2000(a, b) - delta_e2000(b, a)) < 1e-9
    assert abs(delta_e2000("#d62728", "#d94801") - 11.67) < 0.01


def test_log_axes_need_their_tick_values():
    fig = go.Figure(go.Scatter(x=[1, 10, 100], y=[1, 2, 3]))
    fig.update_xaxes(type="log")
    assert len(log_axis_ticks(fig.to_plotly_json())) == 1
    fig.update_xaxes(tickvals=[1, 10, 100])
    assert log_axis_ticks(fig.to_plotly_json()) == []


def test_notebook_figures_are_read_from_the_executed_outputs():
    fig = go.Figure(go.Scatter(x=[1], y=[1], name="x"))
    fig.update_layout(title="t &nbsp;", meta={"moelab_figure": "demo"})
    executed = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "data": {"application/vnd.plotly.v1+json": fig.to_plotly_json()}}]}]}
    found = notebook_figure_problems(executed)
    assert found["text_entities"] and found["text_entities"][0].startswith("demo:")


def test_annotations_on_data_axes_of_binary_encoded_figures_are_placed():
    """plotly 6 stores numpy arrays as base64 ({dtype, bdata}) in the JSON a notebook keeps: the axis extent is
    still read, so two close vline labels (03's r* and sim opt) are found to overlap."""
    import json

    import numpy as np

    fig = go.Figure(go.Scatter(x=np.arange(1.0, 13.0), y=np.arange(12.0)))
    fig.add_vline(x=3.54, annotation_text="r* = 3.54")
    fig.add_vline(x=4.0, annotation_text="sim opt = 4")
    assert label_overlaps(json.loads(fig.to_json()))
    apart = go.Figure(go.Scatter(x=np.arange(1.0, 13.0), y=np.arange(12.0)))
    apart.add_vline(x=3.54, annotation_text="r* = 3.54", annotation_position="top left")
    apart.add_vline(x=4.0, annotation_text="sim opt = 4", annotation_position="top right")
    assert label_overlaps(json.loads(apart.to_json())) == []


def test_a_series_drawn_under_an_identical_one_is_hidden_unless_the_figure_says_so():
    x, y = [1, 2, 3, 4], [10.0, 12.0, 15.0, 11.0]
    hides = go.Figure([go.Scatter(x=x, y=y, name="JSQ", mode="lines+markers", line_color="#1f77b4"),
                       go.Scatter(x=x, y=[v + 0.001 for v in y], name="least-KV", mode="lines+markers",
                                  line_color="#d62728")])
    found = hidden_series(hides.to_plotly_json())
    assert len(found) == 1 and "'JSQ'" in found[0] and "'least-KV'" in found[0], found
    assert figure_problems(hides)["hidden_series"] == found  # one of the checks every figure gets
    # the same figure saying so in a legend name or an annotation: deliberate
    said = go.Figure(hides)
    said.data[1].name = "least-KV (= JSQ here)"
    assert hidden_series(said.to_plotly_json()) == []
    noted = go.Figure(hides)
    noted.add_annotation(x=2, y=12, text="JSQ and least-KV coincide")
    assert hidden_series(noted.to_plotly_json()) == []


def test_series_that_stay_visible_are_not_hidden():
    x, y = [1, 2, 3, 4], [10.0, 12.0, 15.0, 11.0]
    apart = go.Figure([go.Scatter(x=x, y=y, name="a"), go.Scatter(x=x, y=[v + 1 for v in y], name="b")])
    assert hidden_series(apart.to_plotly_json()) == []
    # 04's fix: open circles drawn around the crosses beneath them; 01's: smaller markers nested in larger ones
    open_top = go.Figure([go.Scatter(x=x, y=y, mode="markers", name="sync", marker={"symbol": "x", "size": 9}),
                          go.Scatter(x=x, y=y, mode="markers", name="pipelined",
                                     marker={"symbol": "circle-open", "size": 14})])
    assert hidden_series(open_top.to_plotly_json()) == []
    nested = go.Figure([go.Scatter(x=x, y=y, name="a", marker={"size": 16}), go.Scatter(x=x, y=y, name="b",
                                                                                         marker={"size": 10})])
    assert hidden_series(nested.to_plotly_json()) == []
    # a dashed or thinner line on top shows the one beneath; the reverse order hides it
    lines = go.Figure([go.Scatter(x=x, y=y, mode="lines", name="eldr", line={"width": 4}),
                       go.Scatter(x=x, y=y, mode="lines", name="oracle", line={"width": 2, "dash": "dash"})])
    assert hidden_series(lines.to_plotly_json()) == []
    lines = go.Figure([go.Scatter(x=x, y=y, mode="lines", name="oracle", line={"width": 2}),
                       go.Scatter(x=x, y=y, mode="lines", name="eldr", line={"width": 4})])
    assert len(hidden_series(lines.to_plotly_json())) == 1
    # a series covering only part of another, or on other axes, or not shown, hides nothing
    part = go.Figure([go.Scatter(x=x, y=y, name="a"), go.Scatter(x=x[:2], y=y[:2], name="b")])
    assert hidden_series(part.to_plotly_json()) == []
    other = go.Figure([go.Scatter(x=x, y=y, name="a"), go.Scatter(x=x, y=y, name="b", xaxis="x2", yaxis="y2")])
    other.update_layout(xaxis2={"domain": [0.6, 1]}, yaxis2={"anchor": "x2"})
    assert hidden_series(other.to_plotly_json()) == []
    legend_only = go.Figure([go.Scatter(x=x, y=y, name="a"), go.Scatter(x=x, y=y, name="b", visible="legendonly")])
    assert hidden_series(legend_only.to_plotly_json()) == []


def test_hidden_series_reads_binary_encoded_and_category_data():
    import json

    import numpy as np

    x = np.arange(1.0, 300.0)
    fig = go.Figure([go.Scatter(x=x, y=np.sqrt(x), name="fit"), go.Scatter(x=x, y=np.sqrt(x), name="measured")])
    assert len(hidden_series(json.loads(fig.to_json()))) == 1  # plotly 6 stores numpy arrays as base64
    cats = go.Figure([go.Scatter(x=["a", "b"], y=[1, 2], name="p", mode="markers"),
                      go.Scatter(x=["a", "b"], y=[1, 2], name="q", mode="markers")])
    assert len(hidden_series(cats.to_plotly_json())) == 1
    cats.data[1].x = ("a", "c")
    assert hidden_series(cats.to_plotly_json()) == []


def _executed(*outputs: dict) -> dict:
    return {"cells": [{"cell_type": "code", "source": "", "outputs": list(outputs)}]}


def test_entities_a_reader_would_see_raw_in_outputs_are_found():
    html_out = {"output_type": "display_data", "data": {"text/html": "<b>it&amp;#x27;s</b> a &lt;tag&gt; &amp; more",
                                                        "text/plain": "<HTML object>"}}
    found = output_raw_entities(_executed(html_out))
    assert len(found) == 1 and "escaped twice" in found[0] and "&amp;#x27;" in found[0]
    nbsp = {"output_type": "display_data", "data": {"text/html": "a&nbsp;| b &#x27;c&#x27;"}}
    assert len(output_raw_entities(_executed(nbsp))) == 3  # valid HTML, but written as characters or CSS here
    printed = {"output_type": "stream", "name": "stdout", "text": ["x &ge; y\n"]}
    assert "printed text" in output_raw_entities(_executed(printed))[0]
    clean = {"output_type": "display_data", "data": {"text/html": "<span title=\"a &quot;b&quot;\">it's &lt;ok&gt;</span>",
                                                     "text/markdown": "**fine** &amp; plain"}}
    assert output_raw_entities(_executed(clean, {"output_type": "stream", "name": "stdout", "text": "a & b;\n"})) == []


def test_the_demo_text_is_escaped_once_and_holds_no_entity():
    from types import SimpleNamespace

    from moelab.viz.hd import acceptance_html

    words = {1: "it's", 2: " <b>&", 3: "\n", 4: "  x"}
    tokenizer = SimpleNamespace(decode=lambda ids: words[ids[0]])
    result = SimpleNamespace(steps=[SimpleNamespace(accepted=[1, 2], sources=["W", "S"], bonus=3),
                                    SimpleNamespace(accepted=[-1], sources=["L"], bonus=4)])
    out = acceptance_html(tokenizer, result)
    assert "it's" in out and " &lt;b&gt;&amp;" in out and "\u21b5<br>" in out and "&nbsp;" not in out
    executed = _executed({"output_type": "display_data", "data": {"text/html": out, "text/plain": "<HTML>"}})
    assert output_raw_entities(executed) == []


def test_title_too_wide_for_the_book_column_is_found():
    from moelab.viz.hygiene import title_overflows

    long = "DSD timeline: draft on the edge, uplink, verify in the cloud, downlink (gamma=5, t_a=10, RTT=60, t_v=50 ms)"
    assert title_overflows({"layout": {"title": {"text": long}}})  # cut at the book's width (tenth read)
    split = long.replace(" (", "<br><sup>").replace(")", "</sup>")
    assert title_overflows({"layout": {"title": {"text": split}}}) == []
    assert title_overflows({"layout": {"title": {"text": long}, "width": 1400}}) == []  # a figure sized wider
    assert title_overflows({"layout": {"title": {"text": long, "font": {"size": 11}}}}) == []
    assert title_overflows({"layout": {}}) == [] and title_overflows({"layout": {"title": "short"}}) == []


def test_table_word_wider_than_its_column_is_found():
    # thirteenth read: 05's costs table cut "sglang_minimum_tokens" at a 1280-px window (plotly wraps only at spaces)
    from moelab.viz.hygiene import table_cells_cut

    def fig(cells, header=("router", "p50"), width=None, columnwidth=None):
        table = {"type": "table", "header": {"values": list(header)}, "cells": {"values": cells}}
        if columnwidth:
            table["columnwidth"] = columnwidth
        return {"data": [table], "layout": {"margin": {"l": 20, "r": 20}, **({"width": width} if width else {})}}

    cut = table_cells_cut(fig([["sglang_minimum_tokens"], ["1.0"]], columnwidth=[1, 4]))
    assert len(cut) == 1 and "column 0" in cut[0] and "sglang_minimum_tokens" in cut[0]
    assert table_cells_cut(fig([["sglang minimum tokens"], ["1.0"]], columnwidth=[1, 4])) == []  # wraps at spaces
    assert table_cells_cut(fig([["sglang_minimum_tokens"], ["1.0"]])) == []  # half of the width is enough
    assert table_cells_cut(fig([["sglang_minimum_tokens"], ["1.0"]], columnwidth=[1, 4], width=2000)) == []
    assert table_cells_cut(fig([["x"], ["1"]], header=("a<br>dispatch_us_per_request", "p"), columnwidth=[1, 9]))
    assert table_cells_cut({"data": [{"type": "scatter", "x": [1]}], "layout": {}}) == []
