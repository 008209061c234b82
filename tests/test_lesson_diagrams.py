"""The six lesson diagrams (moelab.viz.diagrams): every axis titled or hidden, drawn to scale where the
mechanism is a time or load budget, and bad arguments rejected with a message naming the parameter."""

from __future__ import annotations

import numpy as np
import pytest

from moelab.dsd import latency_per_token
from moelab.viz import diagrams as d
from moelab.viz import untitled_axes

BUILDERS = {
    "eldr": d.eldr_tier_diagram,
    "hd": d.hd_walk_diagram,
    "dsd": d.dsd_timeline_diagram,
    "dp": d.dp_barrier_diagram,
    "two_level": d.two_level_routing_diagram,
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_diagram_has_a_title_and_no_untitled_axis(name):
    fig = BUILDERS[name]()
    assert untitled_axes(fig) == []
    assert str(fig.layout.title.text or "").strip()
    assert len(fig.layout.shapes) + len(fig.data) > 0  # something is drawn
    fig.to_json()  # serialisable (the notebook runner saves it)


def test_schematic_diagrams_hide_their_axes():
    for name in ("eldr", "hd", "two_level"):
        fig = BUILDERS[name]()
        assert fig.layout.xaxis.visible is False and fig.layout.yaxis.visible is False, name


@pytest.mark.parametrize("gamma,t_a,rtt,t_v", [(5, 10.0, 60.0, 50.0), (3, 20.0, 10.0, 30.0), (4, 0.0, 0.0, 5.0)])
def test_dsd_timeline_matches_the_closed_forms(gamma, t_a, rtt, t_v):
    rounds = 3
    seg = d.dsd_timeline(gamma=gamma, t_a=t_a, rtt=rtt, t_v=t_v, rounds=rounds)
    # with every draft accepted (alpha -> 0 makes E = 1, so latency per token = time per round)
    for mode in ("dsd_sync", "dsd_pipelined"):
        per_round = float(latency_per_token(mode, alpha=0.0, gamma=gamma, t_a=t_a, t_v=t_v, rtt=rtt))
        downlinks = sorted(end for _, kind, _, end in seg[mode] if kind == "downlink")
        assert len(downlinks) == rounds
        assert np.allclose(np.diff(downlinks), per_round)
        for lane, kind, start, end in seg[mode]:
            assert end >= start
            assert (lane, kind) in {("edge", "draft"), ("network", "uplink"), ("cloud", "verify"),
                                    ("network", "downlink")}
    # sync: a round is draft + uplink + verify + downlink, back to back
    assert np.isclose(max(e for *_, e in seg["dsd_sync"]), rounds * (gamma * t_a + rtt + t_v))


def test_hd_walk_draws_one_arrow_per_store_that_supplied_a_token():
    def draft_arrows(fig):  # arrows that end on the draft row (y 3.25), by the x of their tail
        return sorted(a.ax for a in fig.layout.annotations if a.showarrow and a.y == 3.25)

    mixed = d.hd_walk_diagram(("sat", "on", "a"), 3, "rug", "W", {"W": 1, "S": 2, "L": 1}, ["W", "W", "S"])
    assert draft_arrows(mixed) == [1.6, 4.8]  # from W and from S, not from L
    assert draft_arrows(d.hd_walk_diagram(("sat", "on"), 1, "rug", "S")) == [4.8]


def test_hd_walk_colours_a_draft_token_by_its_store_and_marks_acceptance_without_colour():
    """Sixth student read: accepted tokens were W's green (a token S drafted among them) and the stores that
    supplied a token were pink, the others grey: one colour now means one store."""
    from moelab.viz.common import color_for

    fig = d.hd_walk_diagram(("sat", "on", "a", "mat"), 2, "rug", "W", {"W": 1, "S": 2, "L": 1}, ["W", "W", "S", "L"])
    boxes = [s for s in fig.layout.shapes if s.type == "rect"]
    draft_row = sorted((s for s in boxes if s.y0 == 2.4), key=lambda s: s.x0)
    assert [s.fillcolor for s in draft_row] == [color_for(k) for k in "wwsl"]
    stores = [s for s in boxes if s.y0 == 4.3]
    assert len({s.fillcolor for s in stores}) == 1  # asked or not, supplying or not: one fill
    store_colours = {color_for(k) for k in "wsl"}
    others = [s for s in boxes if s.y0 != 2.4]
    assert not {s.fillcolor for s in others} & store_colours
    marks = [a.text for a in fig.layout.annotations if a.y == 2.05]
    assert marks == ["✓", "✓", "✗"]  # two accepted, the first mismatch; the token after it is not judged
    assert "→" in fig.layout.title.text


def test_dp_barrier_places_the_request_inside_a_margin():
    fig = d.dp_barrier_diagram((6.0, 9.0, 4.0, 7.0), new_request=2.0)
    load, margin, new = fig.data
    assert list(margin.y) == [3.0, 0.0, 5.0, 2.0]
    assert list(new.x) == ["rank 2"]  # the largest margin that fits the request


@pytest.mark.parametrize("call, param", [
    (lambda: d.eldr_tier_diagram(n_decode=0), "n_decode"),
    (lambda: d.eldr_tier_diagram(n_decode=3, routed_to=3), "routed_to"),
    (lambda: d.hd_walk_diagram(accepted=9), "accepted"),
    (lambda: d.hd_walk_diagram(stores_hit="X"), "stores_hit"),
    (lambda: d.hd_walk_diagram(token_sources=["W", "X", "S", "L"]), "token_sources"),
    (lambda: d.hd_walk_diagram(token_sources=["W"]), "token_sources"),
    (lambda: d.dsd_timeline_diagram(rtt=-1.0), "rtt"),
    (lambda: d.dsd_timeline_diagram(gamma=0), "gamma"),
    (lambda: d.dp_barrier_diagram([1.0, float("nan")]), "loads"),
    (lambda: d.two_level_routing_diagram(ranks=4, rank=4), "rank"),
])
def test_bad_arguments_name_the_parameter(call, param):
    with pytest.raises(ValueError, match=param):
        call()


def test_eldr_titles_fit_a_book_column():
    """Seventh student read: the tier diagram's and the greedy curve's one-line titles (104 and 112 characters) were
    cut off at a book column's 800 px; each line of a title now fits."""
    from moelab.viz import eldr as viz_eldr  # lazy: only this test draws the greedy curve

    titles = [d.eldr_tier_diagram().layout.title.text,
              viz_eldr.fig_greedy_curve(np.array([0.5, 0.6, 0.55]), calibration_requests=192, patience=2).layout.title.text]
    for title in titles:
        assert max(len(line) for line in title.split("<br>")) <= 80, title
