"""The DSD panel's sliders really redraw the figures (callbacks run headless)."""

from __future__ import annotations

import numpy as np
import pytest

import moelab.dsd as dsd

pytest.importorskip("anywidget")
from moelab.viz.dsd import dsd_panel  # noqa: E402


def test_dsd_panel_updates_on_sliders():
    panel = dsd_panel(rtt=60, alpha=0.8, gamma=5, t_a=10, t_ar=50, t_d=10)
    controls, text, bars, curve, regions = panel.children
    s_rtt, s_alpha, s_gamma = controls.children[0].children
    s_ta, s_tar, s_td = controls.children[1].children
    expected = [float(dsd.latency_per_token(m, alpha=0.8, gamma=5, t_ar=50, t_d=10, t_a=10, rtt=60)) for m in dsd.MODES]
    assert np.allclose(bars.data[0].y, expected)
    s_rtt.value = 200
    assert bars.data[0].y[2] > expected[2]  # sync DSD pays the longer round trip
    assert list(regions.data[-1].x) == [200]
    z_before = np.array(regions.data[1].z)
    title_before = regions.layout.title.text
    s_tar.value = 20  # a fast target: the AR-vs-DSD map changes
    assert not np.array_equal(z_before, np.array(regions.data[1].z))
    assert regions.layout.title.text != title_before and "t_ar=20" in regions.layout.title.text
    assert "at no RTT" in text.value or "below RTT" in text.value
