"""The AFD panel's sliders really redraw the figures (callbacks run headless)."""

from __future__ import annotations

import numpy as np
import pytest

import moelab.afd as afd

pytest.importorskip("anywidget")
from moelab.viz.afd import afd_panel  # noqa: E402


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
