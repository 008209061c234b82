"""The AFD panel's sliders really redraw the figures (callbacks run headless)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import moelab.afd as afd

pytest.importorskip("anywidget")
from moelab.viz.afd import afd_panel, idle_title, ratio_table_figure, signed_pct  # noqa: E402


def _parts(panel):
    controls, status, f_tp, f_idle = panel.children
    left, right = controls.children
    return left.children, right.children, status, f_tp, f_idle


def test_afd_panel_updates_on_slider_and_calibration():
    panel = afd_panel(256, 100, 500, N=300, r_values=(1, 4, 12))
    (s_B, s_P, s_D, s_N, h200, sim_box), coef, status, f_tp, f_idle = _parts(panel)
    assert "r* = " in status.value
    before = np.array(f_tp.data[0].y, dtype=float)
    s_D.value = 1000
    after = np.array(f_tp.data[0].y, dtype=float)
    assert not np.allclose(before, after)
    r_star = afd.optimal_ratio(256, 100, 1000, float(10 ** s_N.value))
    assert f"r* = {r_star:.2f}" in status.value
    h200.value = True
    assert all(c.disabled for c in coef) and "h200" in status.value
    sim_box.value = False
    assert np.all(np.isnan(np.array(f_tp.data[1].y, dtype=float)))


def test_throughput_axis_names_the_unit_whole():
    # the H200 coefficients are in ms: the axis once read "tokens per m"
    from moelab.viz.afd import throughput_figure

    sim = afd.sweep([1, 2], 64, 100, 100, requests=200, seed=0)
    h200 = afd.coefficients_from_tables("h200", B=64)
    fig = throughput_figure(sim, B=64, mu_P=100, mu_D=100, N=200, coeffs=h200)
    assert fig.layout.yaxis.title.text == "tokens per ms per instance"
    paper = throughput_figure(sim, B=64, mu_P=100, mu_D=100, N=200)
    assert paper.layout.yaxis.title.text == "tokens per cycle per instance"


def test_pipeline_schedule_settles_at_the_slowest_stage():
    from moelab.viz.afd import PIPELINE_STAGES, bundle_diagram, pipeline_schedule

    times = {"attention": 3.0, "A→F link": 1.0, "FFN": 5.0, "F→A link": 1.0}
    sched = pipeline_schedule(times, microbatches=3, steps=4)
    assert len(sched) == 3 * 4 * len(PIPELINE_STAGES)
    ffn = sched[sched["stage"] == "FFN"].sort_values("start")
    # the FFN is the slowest stage: once busy it never idles, one microbatch every t_F
    assert np.allclose(np.diff(ffn["start"].to_numpy())[2:], times["FFN"])
    for _, group in sched.groupby("stage"):  # one server per stage: no two microbatches overlap on it
        g = group.sort_values("start")
        assert np.all(g["start"].to_numpy()[1:] >= g["end"].to_numpy()[:-1] - 1e-12)
    with pytest.raises(ValueError, match="stage_ms"):
        pipeline_schedule({"attention": 1.0})
    fig = bundle_diagram(4, 256, 100, 500, 10_000)
    assert len(fig.data) == len(PIPELINE_STAGES) and "t_cyc" in fig.layout.annotations[1].text
    with pytest.raises(ValueError, match="r must be"):
        bundle_diagram(0)


def test_signed_pct_never_prints_a_sign_without_a_size():
    assert signed_pct(7.26) == "+7.3%" and signed_pct(-15.0) == "-15.0%" and signed_pct(0.0) == "+0.0%"
    assert signed_pct(-0.003957) == "-0.004%" and signed_pct(0.0003) == "+0.0003%"
    assert signed_pct(-0.049) == "-0.05%"
    small = np.concatenate([-np.logspace(-6, 1, 200), np.logspace(-6, 1, 200)])
    assert not any(signed_pct(v) in ("-0.0%", "+0.0%") for v in small)


def test_ratio_table_figure_shows_every_row_without_scrolling():
    # issue 40's second read: the r* table's figure was shorter than its 12 rows, so its last two (B = 512) hid
    # behind the table's scroll bar; the plot area must hold the header and every row
    table = afd.ratio_table(B_values=(64, 128, 256, 512), mu_P_values=(100, 500, 2000), mu_D_values=(100, 500, 1000),
                            N=10_000)
    fig = ratio_table_figure(table)
    tab = fig.data[0]
    rows = len(tab.cells.values[0])
    assert rows == 12
    plot_area = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert plot_area >= tab.header.height + rows * tab.cells.height


def test_idle_title_says_where_the_simulated_curves_cross():
    """The idle figure's title is true of its series: theory crosses at zero idle; a simulation whose curves cross
    where both sides still wait says so (the old fixed title claimed neither side waits at the crossing)."""
    r = np.array([1.0, 2.0, 3.0])
    waiting = pd.DataFrame({"r": r, "sim_attention_idle": [0.02, 0.05, 0.10], "sim_ffn_idle": [0.20, 0.05, 0.01]})
    title = idle_title(waiting)
    assert "theory crosses at zero idle" in title and "simulation at 5.0% (both still wait)" in title
    assert "neither waits" not in title
    meeting = waiting.assign(sim_attention_idle=[0.0, 0.0, 0.1], sim_ffn_idle=[0.2, 0.0, 0.0])
    assert idle_title(meeting).endswith("simulation near zero too")
    apart = waiting.assign(sim_ffn_idle=[0.3, 0.3, 0.3])
    assert idle_title(apart).endswith("does not cross in the swept r")
    unsimulated = waiting.assign(sim_attention_idle=np.nan, sim_ffn_idle=np.nan)
    assert idle_title(unsimulated) == "Idle share of each side: theory crosses at zero idle"


def test_afd_panel_simulates_the_headlines_grid():
    # the panel once simulated only its coarse r_values: its peak (r = 8) and idle crossing disagreed with the
    # notebook's headline, which fills in every integer around the coarse optimum
    panel = afd_panel(256, 100, 500, N=300, r_values=(1, 4, 12))
    *_, f_tp, _ = _parts(panel)
    check = afd.simulated_optimum(256, 100, 500, requests=float(10 ** 2.5), r_values=(1, 4, 12), seed=0)
    sim = f_tp.data[1]
    assert list(np.array(sim.x, dtype=float)) == list(check.fine["r"].astype(float))
    assert len(sim.x) > 3
    assert float(sim.x[int(np.nanargmax(np.array(sim.y, dtype=float)))]) == check.r_sim
