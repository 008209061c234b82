"""One colour per router/method across the lab's figures (``moelab.viz.common.color_for``), the static
fallback of widget panels and the FigureWidget state sync that Voila relies on."""

from __future__ import annotations

import re
import types

import pandas as pd
import plotly.graph_objects as go
import pytest

from moelab.presets import preset_values
from moelab.viz import balanceroute as brviz
from moelab.viz import deployment as dviz
from moelab.viz import dsd as dsdviz
from moelab.viz import eldr as eldrviz
from moelab.viz import hd as hdviz
from moelab.viz.common import (
    FALLBACK_COLORS,
    PALETTE,
    color_for,
    refresh,
    static_fallback_html,
    sync_widget_state,
)

HEX = re.compile(r"^#[0-9a-f]{6}$")

# Names that appear together in one figure must not share a colour.
FIGURE_GROUPS = {
    "eldr routers": ("round_robin", "random", "jsq", "p2c", "least_kv", "vllm_dp", "domain_oracle", "eldr"),
    # (05 never runs the unversioned vllm_dp, ex.ALL_BASELINES leaves it out: vllm_dp@0.32 takes its family's colour)
    "balanceroute routers": ("round_robin", "jsq", "least_kv", "vllm_dp@0.32", "vllm_dp@latest",
                             "vllm_dp@legacy", "sglang_round_robin", "sglang_minimum_tokens", "sglang_total_tokens",
                             "br0", "brh_oracle", "brh_survival", "brh_exact_match", "brh_learned", "brh_tuned_oracle"),
    "hd methods": ("AR", "PLD", "W", "S", "L", "HD(WSL)", "HD(LSW)", "HD(SWL)"),
    "hd vllm methods": ("AR", "ngram", "suffix", "HD-cost", "HD-fixed", "REST"),
    "hd vllm shown names": ("AR (no drafting)", "HD (cost-aware)", "HD (paper, fixed)", "vLLM ngram (prompt lookup)",
                            "vLLM suffix decoding"),
    "hd stores": ("W", "S", "L", "P", "bonus"),
    "dsd modes": ("ar", "colocated", "dsd_sync", "dsd_pipelined"),
    "dsd drafters": ("early_exit", "pld", "hd"),
    "afd": ("theory", "simulation", "attention", "ffn"),
}

# Names that share one figure of notebook 05 (the 16 routers above share its tables, never one figure): the routers of
# its imbalance-over-time figure, and of its sweep figures at every preset (SWEEP_ROUTERS).
SAME_FIGURE_05 = {
    "balanceroute imbalance over time": ("round_robin", "jsq", "least_kv", "vllm_dp@0.32", "sglang_total_tokens", "br0",
                                         "brh_oracle", "brh_survival"),
    **{f"balanceroute sweeps ({preset})": tuple(preset_values("05_balanceroute", preset)["SWEEP_ROUTERS"])
       for preset in ("ci", "classroom", "full")},
}


def test_color_for_is_stable_and_case_insensitive():
    assert color_for("JSQ") == color_for("jsq") == PALETTE["jsq"]
    assert color_for("rr") == color_for("round_robin")
    assert color_for("HD(WSL)") == color_for("hd(wsl)")
    assert color_for("vllm_dp@0.99") == color_for("vllm_dp")  # a new version keeps its family's colour
    unknown = color_for("some_new_router")
    assert unknown in FALLBACK_COLORS and unknown == color_for("Some_New_Router")
    assert all(HEX.match(c) for c in [*PALETTE.values(), *FALLBACK_COLORS])
    assert not set(FALLBACK_COLORS) & set(PALETTE.values()), "a fallback colour collides with a fixed one"
    with pytest.raises(ValueError, match="name"):
        color_for("")


@pytest.mark.parametrize("group", sorted(FIGURE_GROUPS))
def test_names_sharing_a_figure_have_distinct_colours(group):
    names = FIGURE_GROUPS[group]
    colours = [color_for(n) for n in names]
    assert len(set(colours)) == len(colours), {n: c for n, c in zip(names, colours)}
    # distinct is not enough: two methods on one figure must be told apart at a glance (issue 40: HD-fixed and
    # vLLM ngram were two near-identical blues)
    from moelab.viz.hygiene import MIN_COLOR_DELTA_E, delta_e

    close = [(a, b, round(delta_e(color_for(a), color_for(b)), 1)) for i, a in enumerate(names) for b in names[i + 1:]
             if delta_e(color_for(a), color_for(b)) < MIN_COLOR_DELTA_E]
    assert not close, f"{group}: colours closer than {MIN_COLOR_DELTA_E} (CIE76): {close}"


@pytest.mark.parametrize("group", sorted(set(FIGURE_GROUPS) - {"balanceroute routers"} | set(SAME_FIGURE_05)))
def test_names_drawn_on_one_figure_pass_the_figure_hygiene_colour_check(group):
    # the check the notebooks' figures get (moelab.viz.hygiene.method_colors): CIE76 and CIEDE2000. Issue 40: CIE76
    # alone let br0 (#d62728) and vllm_dp@0.32 (#d94801) through, 20.8 apart in CIE76 and 11.7 in CIEDE2000
    from moelab.viz.hygiene import colors_too_close

    names = {**FIGURE_GROUPS, **SAME_FIGURE_05}[group]
    close = [(a, b, colors_too_close(color_for(a), color_for(b))) for i, a in enumerate(names) for b in names[i + 1:]
             if colors_too_close(color_for(a), color_for(b))]
    assert not close, f"{group}: {close}"
    assert colors_too_close("#d62728", "#d94801") is not None  # the pair the student saw, caught


def test_distinct_colors_moves_a_clashing_name_to_a_far_fallback():
    from moelab.viz.common import distinct_colors
    from moelab.viz.hygiene import MIN_COLOR_DELTA_E, delta_e

    given = distinct_colors(["HF, measured now", "HF, cached curve", "another engine", "jsq", "p2c"])
    values = list(given.values())
    assert given["jsq"] == color_for("jsq") or delta_e(given["jsq"], color_for("jsq")) > 0
    assert all(delta_e(a, b) >= MIN_COLOR_DELTA_E for i, a in enumerate(values) for b in values[i + 1:])


def test_every_registered_router_and_model_has_a_fixed_colour():
    from moelab.costmodel import MODEL_SHAPES
    from moelab.dsd import MODES
    from moelab.routers import ROUTERS

    lab = [n for n, cls in ROUTERS.items() if cls.__module__.startswith("moelab.")]  # not a test's own router
    for name in [*lab, *MODES, *MODEL_SHAPES]:
        assert name.lower() in PALETTE, f"{name} has no fixed colour in moelab.viz.common.PALETTE"
    shapes = [color_for(m) for m in MODEL_SHAPES]  # the overview draws every shape in one figure
    assert len(set(shapes)) == len(shapes)


def _trace_colours(fig: go.Figure) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for t in fig.data:
        c = t.marker.color if getattr(t, "marker", None) is not None and t.marker.color is not None else None
        if c is None and getattr(t, "line", None) is not None:
            c = t.line.color
        if t.name and isinstance(c, str):
            out.setdefault(t.name, set()).add(c)
    return out


def test_figure_builders_share_the_palette():
    """The same router gets the same colour in the ELDR sweep (both subplots), the BalanceRoute bars,
    the deployment bars and the ELDR panel (both subplots, also after a router change)."""
    routers = ["round_robin", "jsq", "least_kv", "eldr"]
    sweep = pd.DataFrame([{"router": r, "rate": rate, "tpot_ms_p50": 10.0 + i, "distinct_per_layer_step": 5.0 + i}
                          for i, r in enumerate(routers) for rate in (20, 100)])
    bars = pd.DataFrame([{"router": r, "G": g, "tput": 1.0 + i} for i, r in enumerate(routers) for g in (4, 8)])
    figs = [eldrviz.fig_rate_sweep(sweep), brviz.bars(bars, "tput", "t", "tokens / s"),
            dviz.fig_distinct_experts({r: 1.0 for r in routers}, 2)]
    seen: dict[str, set[str]] = {}
    for fig in figs[:2]:
        for name, cs in _trace_colours(fig).items():
            seen.setdefault(name, set()).update(cs)
    for r in routers:
        assert seen[r] == {color_for(r)}, (r, seen[r])
    assert list(figs[2].data[0].marker.color) == [color_for(r) for r in routers]

    # the ELDR panel: its two subplots colour each router the same, and follow the router dropdown
    setup = types.SimpleNamespace(n_workers=4)
    metrics = {"tpot_ms_p50": 1.0, "tpot_ms_p99": 2.0, "distinct_per_layer_step": 3.0}
    panel = eldrviz.eldr_panel({"g": setup}, lambda *a, **k: dict(metrics), n_requests=10, output_len=8,
                               with_workers=lambda s, k: s, routers=("jsq", "eldr", "round_robin"), workers=4)
    fig = next(c for c in panel.children if isinstance(c, go.FigureWidget))
    dropdown = panel.children[0].children[1]

    def check() -> None:
        for i in (0, 2):
            assert fig.data[i].marker.color == fig.data[i + 1].marker.color == color_for(fig.data[i].name)

    check()
    dropdown.value = "round_robin"
    check()
    assert fig.data[2].name == "round_robin"


def test_hd_and_dsd_colour_tables_come_from_the_palette():
    assert hdviz.STORE_COLORS == {k: color_for(k) for k in hdviz.STORE_COLORS}
    assert hdviz.METHOD_COLORS == {k: color_for(k) for k in hdviz.METHOD_COLORS}
    assert dsdviz.MODE_COLORS == {k: color_for(k) for k in dsdviz.MODE_COLORS}


def test_widget_state_follows_the_figure_and_static_fallback(monkeypatch):
    import ipywidgets as w

    fw = go.FigureWidget()
    fw.add_scatter(x=[1, 2], y=[3, 4], name="jsq")  # an edit after creation: plotly sends it as a message only
    assert fw._widget_data == []
    sync_widget_state(fw)
    assert [t["name"] for t in fw._widget_data] == ["jsq"]
    refresh(fw, go.Figure(go.Scatter(x=[1, 2], y=[5, 6], name="eldr")))
    assert list(fw._widget_data[0]["y"]) == [5, 6]  # a view created now (Voila, a reload) draws the new data

    panel = w.VBox([w.IntSlider(), w.HBox([fw])])
    monkeypatch.setenv("MOELAB_PNG", "0")
    html = static_fallback_html(panel)
    assert "1 figure(s)" in html and "moelab app" in html
    assert static_fallback_html(w.VBox([w.IntSlider()])) is None  # no figure: nothing to stand in for


def test_notebook_hooks_add_the_fallback_beside_the_live_widget():
    """In an IPython shell, a panel's display bundle keeps the widget view (JupyterLab and Voila render
    it) and gains a text/html stand-in (what GitHub, nbviewer or an HTML export show)."""
    import ipywidgets as w
    from IPython.core.interactiveshell import InteractiveShell

    from moelab.viz.common import install_notebook_hooks

    ip = InteractiveShell.instance()
    assert install_notebook_hooks(ip) and install_notebook_hooks(ip)  # idempotent
    fw = go.FigureWidget()
    fw.add_bar(x=["a"], y=[1.0], name="jsq")
    data, _ = ip.display_formatter.format(w.VBox([w.IntSlider(), fw]))
    assert "application/vnd.jupyter.widget-view+json" in data and "text/html" in data
