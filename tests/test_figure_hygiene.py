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
    delta_e,
    figure_problems,
    label_overlaps,
    log_axis_ticks,
    method_colors,
    notebook_figure_problems,
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
