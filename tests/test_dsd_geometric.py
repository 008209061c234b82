"""The geometric-acceptance test of a recording (fit on draft position 1, check positions 2..gamma) and the
H200 verify curve's monotone fit: a test that can fail, failing where it should and about as often as its
level says where it should not."""

from __future__ import annotations

import math

import numpy as np
import pytest

import moelab.dsd as dsd
from moelab.dsd.acceptance import AcceptanceTrace, SequenceRecord
from moelab.viz.dsd import conditional_acceptance_figure


def _trace(run: np.ndarray, gamma_max: int) -> AcceptanceTrace:
    rec = SequenceRecord(0, "synthetic", np.asarray(run, np.int64), np.full(len(run), gamma_max), np.zeros(len(run)))
    return AcceptanceTrace("synthetic", "none", gamma_max, [rec])


def _iid(alpha: float, gamma_max: int, n: int, seed: int) -> AcceptanceTrace:
    rng = np.random.default_rng(seed)
    return _trace(np.cumprod(rng.random((n, gamma_max)) < alpha, axis=1).sum(axis=1), gamma_max)


def test_wilson_interval_known_values_and_refusals():
    p, lo, hi = dsd.wilson_interval(0, 10)
    assert p == 0 and lo == 0 and hi == pytest.approx(0.2775, abs=1e-4)
    p, lo, hi = dsd.wilson_interval(5, 10)
    assert p == 0.5 and lo == pytest.approx(1 - hi) and lo == pytest.approx(0.2366, abs=1e-4)
    assert all(math.isnan(x) for x in dsd.wilson_interval(0, 0))
    with pytest.raises(ValueError, match="accepted"):
        dsd.wilson_interval(3, 2)


def test_position_acceptance_counts_the_rounds_tries():
    tr = _iid(0.6, 5, 2000, seed=1)
    pos = tr.position_acceptance(4)
    a = tr.rounds(4)["accepted"]
    assert pos["tried"][0] == a.size and pos["accepted"][-1] == np.sum(a >= 4)
    assert pos["tried"][1:].tolist() == pos["accepted"][:-1].tolist()  # token j is tried when j-1 were accepted
    assert tr.first_token_rate(4) == pos["accepted"][0] / pos["tried"][0]
    # the pooled maximum-likelihood alpha is the share of all tries accepted, so it lies between the two rates
    t = tr.geometric_test(4)
    assert min(t.first_rate, t.later_rate) <= tr.alpha(4) <= max(t.first_rate, t.later_rate)


def test_geometric_acceptance_passes_about_as_often_as_the_level_says():
    # under the null (i.i.d. acceptance) the test rejects about 1 - level of the time: it is not rigged to pass
    rejected = sum(not _iid(0.5, 4, 300, seed=s).geometric_test(4).consistent for s in range(300))
    assert 3 <= rejected <= 30, rejected  # 5% of 300 is 15


def test_sticky_acceptance_is_rejected():
    # a prompt-lookup-like drafter: its first token is rarely right, but once it is, the next ones mostly are
    rng = np.random.default_rng(0)
    first = rng.random(3000) < 0.1
    later = np.cumprod(rng.random((3000, 5)) < 0.8, axis=1).sum(axis=1)
    t = _trace(np.where(first, 1 + later, 0).clip(0, 6), 6).geometric_test(6)
    assert t.testable and not t.consistent and t.difference_interval[0] > 0


def test_untestable_without_a_second_position():
    t = _iid(0.5, 3, 200, seed=0).geometric_test(1)
    assert not t.testable and not t.consistent and t.later_tries == 0
    with pytest.raises(ValueError, match="level"):
        _iid(0.5, 3, 200, seed=0).geometric_test(2, level=1.0)


def test_shipped_recording_rejects_pld_only_where_its_interval_leaves_out_zero():
    traces, _ = dsd.load_shipped()
    for tr in traces.values():
        t = tr.geometric_test()
        lo, hi = t.difference_interval
        assert t.consistent == (lo <= 0 <= hi)
        assert lo <= t.difference <= hi


def test_conditional_figure_draws_the_fit_on_position_one_at_the_given_gamma():
    traces, _ = dsd.load_shipped()
    fig = conditional_acceptance_figure(traces, {"early_exit": 5})
    lines = {tr.name: tr for tr in fig.data}
    ee = traces["early_exit"]
    fit = next(v for k, v in lines.items() if k.startswith(ee.drafter) and "geometric" in k)
    assert len(fit.y) == 5 and np.allclose(fit.y, ee.first_token_rate(5))
    measured = next(v for k, v in lines.items() if k.startswith(ee.drafter) and "measured" in k)
    assert np.allclose(measured.y, ee.position_acceptance(5)["rate"])


def test_h200_verify_curve_is_the_monotone_fit_of_the_table():
    curve = dsd.h200_verify_curve("llama2-7b")
    table, fit = np.asarray(curve["table_ms"]), np.asarray(curve["fitted_ms"])
    assert np.all(np.diff(fit) >= 0)
    assert curve["falls"] == [(a, b) for a, b, x, y in zip(curve["qs"], curve["qs"][1:], table, table[1:]) if y < x]
    pooled = {q for b in curve["pooled_blocks"] for q in b["qs"]}
    keep = [i for i, q in enumerate(curve["qs"]) if q not in pooled]
    assert np.array_equal(fit[keep], table[keep])  # unchanged wherever the medians already rise
    one = dsd.h200_verify_batch_ms("llama2-7b")
    assert one(1, 4) == pytest.approx(float(curve["verify"](4)))  # the batched server reads the same fit
    with pytest.raises(ValueError, match="q must be"):
        curve["verify"](1000)
