"""Outcomes and step times are counted when next read, in the order recorded: the numbers must be those of
counting each at once, whenever the reads come, and the logs stay bounded."""

from __future__ import annotations

import random

import pytest

from moelab.costmodel.verify import ONLINE_PENDING, OnlineVerifyCost, VerifyCost
from moelab.hd.policy import LOG_LIMIT, PRIOR_WEIGHT, AcceptanceModel, EngineAcceptance


def _outcomes(n: int, seed: int = 0) -> list[tuple[str, bool, int, bool]]:
    rng = random.Random(seed)
    return [(rng.choice("WSL"), rng.random() < 0.2, rng.randrange(16), rng.random() < 0.6) for _ in range(n)]


def _eager(outcomes, keep):
    tried, acc = {}, {}
    for s, alt, c, ok in outcomes:
        k = (s, alt, c)
        tried[k] = tried.get(k, 0.0) * keep + 1.0
        acc[k] = acc.get(k, 0.0) * keep + (1.0 if ok else 0.0)
    return tried, acc


@pytest.mark.parametrize("read_every", [1, 7, 10**9])
def test_acceptance_counts_equal_counting_at_once(read_every):
    engine = EngineAcceptance(0.4)
    model = engine.new_request()
    outs = _outcomes(3 * LOG_LIMIT + 5)
    for i, (s, alt, c, ok) in enumerate(outs):
        model.record(s, alt, ok, c)
        assert len(model._log) < LOG_LIMIT and len(engine._log) < LOG_LIMIT
        if i % read_every == 0:
            model.alphas(s, c)
    tried, acc = _eager(outs, model._keep)
    assert model.tried == tried and model.accepted == acc  # exactly: the same float operations in order
    e_tried, e_acc = _eager(outs, engine._keep)
    assert engine.tried == e_tried and engine.accepted == e_acc
    s, alt, c, _ = outs[-1]
    k = (s, alt, c)
    want = (acc[k] + PRIOR_WEIGHT * model.priors.get(k, model.prior)) / (tried[k] + PRIOR_WEIGHT)
    assert model.alphas(s, c)[int(alt)] == want


def test_a_memoised_alpha_is_dropped_when_its_logged_outcome_is_counted():
    model = AcceptanceModel(0.5)
    before = model.alphas("W", 3)
    model.record("W", False, False, 3)
    assert model.alphas("W", 3)[0] < before[0]


@pytest.mark.parametrize("read_every", [1, 5, 10**9])
def test_online_curve_equals_applying_each_observation_at_once(read_every):
    seed = VerifyCost([1, 2, 5, 9], [40.0, 41.0, 44.0, 49.0])
    rng = random.Random(1)
    obs = [(rng.randrange(1, 10), 40.0 * rng.uniform(0.5, 3.0)) for _ in range(2 * ONLINE_PENDING + 3)]
    lazy, eager = OnlineVerifyCost(seed), OnlineVerifyCost(seed)
    for i, (q, ms) in enumerate(obs):
        lazy.observe(q, ms)
        eager.observe(q, ms)
        eager.table  # noqa: B018 - a read applies what is pending
        assert len(lazy._pending) < ONLINE_PENDING
        if i % read_every == 0:
            lazy.draft_threshold(8)
    assert lazy.table == eager.table and lazy.rebuilds == eager.rebuilds and lazy.corrections() == eager.corrections()
    assert lazy.as_dict() == eager.as_dict() and lazy.observations == len(obs)
