"""The Jacobi-window decision: from a verify-cost curve and a gain per window token, does a window pay?"""

from __future__ import annotations

import pytest

from moelab.costmodel.verify import VerifyCost
from moelab.hd.lookahead import (
    best_jacobi_window,
    hf_lookahead_enabled,
    jacobi_window_decision,
    lookahead_gain_bound,
)

STEEP = VerifyCost([1, 2, 29], [162.0, 201.4, 1264.0])  # the shape of the HF CPU curve: ~0.24x per extra token
FLAT = VerifyCost([1, 9], [151.2, 157.2])  # the shape of vLLM's CPU curve: ~0.005x per extra token


def test_break_even_is_where_the_window_stops_paying():
    d = jacobi_window_decision(STEEP, window=8, draft_tokens=3, expected_tokens=1.25, gain_per_token=0.0)
    assert not d.pays and d.break_even_gain > 0
    g = d.break_even_gain
    above = jacobi_window_decision(STEEP, window=8, draft_tokens=3, expected_tokens=1.25, gain_per_token=g * 1.01)
    below = jacobi_window_decision(STEEP, window=8, draft_tokens=3, expected_tokens=1.25, gain_per_token=g * 0.99)
    assert above.pays and not below.pays
    # by hand: c(4) = 162 + 3 * 39.4, c(12) = 162 + 11 * 39.4 (linear between the measured points)
    c4, c12 = float(STEEP(4)), float(STEEP(12))
    assert g == pytest.approx(1.25 * (c12 - c4) / (8 * c4))
    assert above.tokens_per_ms_with == pytest.approx((1.25 + g * 1.01 * 8) / c12)


def test_steep_cpu_curve_never_pays_flat_curve_does_under_the_published_bound():
    bound = lookahead_gain_bound()
    assert bound == pytest.approx(0.64 / 28)
    assert not hf_lookahead_enabled(STEEP, draft_tokens=3, expected_tokens=1.25)
    assert not any(d.pays for d in best_jacobi_window(STEEP, draft_tokens=0, expected_tokens=1.0))
    assert hf_lookahead_enabled(FLAT, draft_tokens=3, expected_tokens=1.25)
    # a draft that already accepts many tokens raises the bar: break-even grows with E
    lo = jacobi_window_decision(FLAT, window=4, draft_tokens=3, expected_tokens=1.2)
    hi = jacobi_window_decision(FLAT, window=4, draft_tokens=3, expected_tokens=3.0)
    assert hi.break_even_gain > lo.break_even_gain


@pytest.mark.parametrize("kw, match", [({"window": 0}, "window"), ({"window": 65}, "window"),
                                       ({"draft_tokens": -1}, "draft_tokens"), ({"expected_tokens": 0.5}, "expected"),
                                       ({"gain_per_token": -0.1}, "gain_per_token")])
def test_bad_inputs(kw, match):
    args = {"window": 4, "draft_tokens": 3, "expected_tokens": 1.25, **kw}
    with pytest.raises(ValueError, match=match):
        jacobi_window_decision(STEEP, **args)
    with pytest.raises(ValueError, match="mat"):
        lookahead_gain_bound(0.5)
