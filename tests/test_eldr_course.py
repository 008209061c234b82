"""Notebook 01's exercise checkers name a student's slip correctly whatever the notebook's K."""

from __future__ import annotations

import pytest

from moelab.course import eldr as course
from moelab.eldr import PAPER_DECODE_WORKERS


@pytest.mark.parametrize("k", [4, 8, 32, 64])
def test_sim_rate_slips_say_which_way_the_scale_goes(k):
    rate = 100.0
    right = course.check_sim_rate(rate * k / PAPER_DECODE_WORKERS, N_WORKERS=k, ABLATION_RATE=rate)
    assert right.ok
    inverted = course.check_sim_rate(rate * PAPER_DECODE_WORKERS / k, N_WORKERS=k, ABLATION_RATE=rate)
    assert not inverted.ok and "inverted" in inverted.message
    if k < PAPER_DECODE_WORKERS:
        assert "fewer workers" in inverted.message and "less traffic, not more" in inverted.message
    else:  # more workers than the paper's get MORE traffic: the old slip said the opposite
        assert "more workers" in inverted.message and "more traffic, not less" in inverted.message
        assert "fewer workers" not in inverted.message
    same = course.check_sim_rate(rate, N_WORKERS=k, ABLATION_RATE=rate)
    assert not same.ok and "paper's rate itself" in same.message
    one = course.check_sim_rate(rate / PAPER_DECODE_WORKERS, N_WORKERS=k, ABLATION_RATE=rate)
    assert not one.ok and "ONE worker" in one.message


def test_at_the_papers_k_the_inverted_scale_is_the_right_answer():
    ok = course.check_sim_rate(100.0, N_WORKERS=PAPER_DECODE_WORKERS, ABLATION_RATE=100.0)
    assert ok.ok
