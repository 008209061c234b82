"""Shared figure helpers: widget refresh and static output."""

from __future__ import annotations

import plotly.graph_objects as go

from moelab.viz import refresh, save_figure, write_results


def _fig(ys: list[list[float]], title: str) -> go.Figure:
    fig = go.Figure([go.Scatter(x=list(range(len(y))), y=y, name=f"s{i}") for i, y in enumerate(ys)])
    fig.update_layout(title=title, yaxis_title=f"{title} axis")
    return fig


def test_refresh_updates_in_place_or_replaces():
    widget = go.FigureWidget(_fig([[1, 2], [3, 4]], "before"))
    first = widget.data[0]
    refresh(widget, _fig([[5, 6, 7], [8, 9, 10]], "after"))
    assert widget.data[0] is first and list(widget.data[0].y) == [5, 6, 7] and list(widget.data[1].x) == [0, 1, 2]
    assert widget.layout.title.text == "after" and widget.layout.yaxis.title.text == "after axis"
    refresh(widget, _fig([[1]], "one"))  # different number of traces: replaced
    assert len(widget.data) == 1 and list(widget.data[0].y) == [1]


def test_static_outputs(tmp_path):
    paths = save_figure(_fig([[1, 2]], "t"), "probe", tmp_path, png=False)
    assert paths["html"].read_text().count("plotly") > 0 and "png" not in paths
    assert write_results("probe", {"x": 1}, tmp_path).read_text().strip().startswith("{")
