"""Cost-aware drafting and the per-row drafters of a batching engine, without a model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.costmodel.verify import VerifyCost, fit_verify_cost
from moelab.hd import HierarchyDrafter, NGramTable, replay_greedy
from moelab.hd.drafters import CostAwareDrafter
from moelab.hd.policy import AcceptanceModel, observe, plan
from moelab.hd.rows import RowDrafters

FLAT = VerifyCost([1, 2, 64], [10.0, 10.0, 10.0])  # verifying more tokens is free
STEEP = VerifyCost([1, 2, 3], [10.0, 20.0, 30.0])  # every verified token costs a full forward


def test_verify_cost_interpolates_and_extrapolates():
    c = VerifyCost([1, 3, 5], [10.0, 14.0, 20.0])
    assert c(2) == pytest.approx(12.0) and c(7) == pytest.approx(26.0) and c.relative(3) == pytest.approx(1.4)
    for qs, ms in (([2, 3], [1.0, 2.0]), ([1, 1], [1.0, 1.0]), ([1, 2], [1.0, -1.0]), ([1], [np.nan])):
        with pytest.raises(ValueError):
            VerifyCost(qs, ms)
    with pytest.raises(ValueError, match="must not decrease"):  # a forward over more tokens never costs less
        VerifyCost([1, 2, 3], [10.0, 12.0, 11.0])


def test_plan_drafts_everything_when_verification_is_free_and_nothing_when_it_is_dear():
    model = AcceptanceModel()
    cands, srcs = [(1, 2, 3), (1, 4), (5,)], ["W", "S", "L"]
    got, _ = plan(cands, srcs, model, FLAT, budget=8)
    assert got == [(1, 2, 3), (1, 4), (5,)]
    got, _ = plan(cands, srcs, model, FLAT, budget=2)  # the budget caps the nodes: the two likeliest
    assert sum(len(c) for c in got) <= 3 and got[0][:1] == (1,)
    for _ in range(50):  # W keeps failing: with a steep cost nothing is worth verifying
        model.record("W", False, False)
    assert plan([(1, 2, 3)], ["W"], model, STEEP, budget=8) == ([], [])


def test_observe_counts_only_tested_nodes():
    m = AcceptanceModel(half_life=float("inf"))  # no decay: plain counts
    observe(m, [(1, 2, 3), (1, 4), (5,)], ["W", "S", "L"], accepted=[1, 2])
    # tested: 1 (W, first) ok; 5 (L, alternative) wrong; 2 (W) ok; 4 (S, alternative) wrong; 3 (W) wrong
    assert m.tried == {("W", False, 0): 3, ("L", True, 0): 1, ("S", True, 0): 1}  # no classes given: class 0
    assert {k: v for k, v in m.accepted.items() if v} == {("W", False, 0): 2}


def test_cost_aware_drafter_is_lossless_and_learns():
    S = NGramTable.build([[4, 10, 11, 12, 13]] * 3, key_lengths=(1,), length=4)
    prompt = [4, 1, 2, 3, 5, 4, 1, 2, 3, 5, 4]
    ref = [1, 2, 3, 5, 4, 1, 2, 3, 5, 4, 9, 9, 4, 1, 2]
    d = CostAwareDrafter(HierarchyDrafter(S, None, order="WS", length=4), FLAT, budget=8)
    res = replay_greedy(d, prompt, ref)
    assert res.tokens == ref and res.mean_accepted > 1.5
    assert d.acceptance.tried  # the verification outcomes reached the policy
    chain = CostAwareDrafter(HierarchyDrafter(S, None, order="WS", length=4), FLAT, budget=6, chain=True)
    chain.start(prompt)
    draft = chain.draft()
    assert len(draft.candidates) == 1 and len(draft.candidates[0]) == 6  # two lookups stitched into one chain
    assert len(draft.sources[0]) == 6


def test_row_drafters_follow_rows_and_reset_on_reuse():
    rows = RowDrafters(lambda: HierarchyDrafter(order="W", length=3), lambda d, m: d.draft_chain(m))
    a = np.array([7, 1, 2, 3, 7])
    assert rows.propose(0, a, 3) == [1, 2, 3]
    # the engine accepted 1, 2 and sampled 9 instead of 3
    assert rows.propose(0, np.array([7, 1, 2, 3, 7, 1, 2, 9]), 3) == []
    assert rows.stats.accepted_tokens == 2 and rows.stats.resets == 0
    # a new request in the same row: its tokens do not extend what the row saw -> fresh drafter
    rows.propose(0, np.array([5, 6, 5]), 3)
    assert rows.stats.resets == 1
    assert rows.propose(1, np.array([5, 6, 5]), 0) == []  # no room left: nothing


def reference_plan(candidates, sources, model, cost, budget, classes=None):
    """plan() written node by node (the trie of the candidates, then the best prefix of the likeliest nodes;
    a node's class is that of the candidate that adds it to the trie)."""
    prob, children, n_children, paths = [1.0], {}, [0], []
    classes = classes if classes is not None else [(0,) * len(c) for c in candidates]
    for cand, src, cls in zip(candidates, sources, classes):
        node, path = 0, []
        for depth, t in enumerate(cand):
            nxt = children.get((node, t))
            if nxt is None:
                letter = src[depth] if len(src) == len(cand) and len(cand) > 1 else src[:1]
                nxt = children[(node, t)] = len(prob)
                prob.append(prob[node] * model.alpha(letter, n_children[node] > 0, cls[depth]))
                n_children[node] += 1
                n_children.append(0)
            path.append(nxt)
            node = nxt
        paths.append(path)
    order = sorted(range(1, len(prob)), key=lambda i: -prob[i])
    ratios = [(1 + sum(prob[i] for i in order[:k])) / float(cost(k + 1)) for k in range(min(budget, len(order)) + 1)]
    k = max(range(len(ratios)), key=lambda j: (ratios[j], -j))  # the smallest k with the best ratio
    keep = set(order[:k])
    out, srcs = [], []
    for cand, src, path in zip(candidates, sources, paths):
        n = 0
        while n < len(path) and path[n] in keep:
            n += 1
        if n and tuple(cand[:n]) not in out:
            out.append(tuple(cand[:n]))
            srcs.append(src[:n] if len(src) == len(cand) and len(cand) > 1 else src)
    return out, srcs


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=5).map(tuple), min_size=1, max_size=5),
       st.lists(st.sampled_from("WSL"), min_size=5, max_size=5), st.integers(1, 12),
       st.lists(st.tuples(st.sampled_from("WSL"), st.booleans(), st.booleans()), max_size=30),
       st.booleans(), st.sampled_from([FLAT, STEEP, VerifyCost([1, 9], [10.0, 14.0])]))
def test_plan_equals_the_node_by_node_trie(cands, letters, budget, history, per_token, cost):
    model = AcceptanceModel()
    for store, alt, ok in history:
        model.record(store, alt, ok)
    srcs = ["".join(letters[(i + d) % 5] for d in range(len(c))) if per_token else letters[i]
            for i, c in enumerate(cands)]
    assert plan(cands, srcs, model, cost, budget) == reference_plan(cands, srcs, model, cost, budget)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=5).map(tuple), min_size=1, max_size=5),
       st.lists(st.sampled_from("WSL"), min_size=5, max_size=5), st.integers(1, 12),
       st.lists(st.tuples(st.sampled_from("WSL"), st.booleans(), st.booleans(), st.integers(0, 3)), max_size=40),
       st.booleans(), st.sampled_from([FLAT, STEEP, VerifyCost([1, 9], [10.0, 14.0])]), st.integers(0, 2**31))
def test_plan_with_confidence_classes_equals_the_node_by_node_trie(cands, letters, budget, history, per_token, cost,
                                                                   seed):
    model = AcceptanceModel()
    for store, alt, ok, cls in history:
        model.record(store, alt, ok, cls)
    rng = np.random.default_rng(seed)
    classes = [tuple(int(x) for x in rng.integers(0, 4, size=len(c))) for c in cands]
    srcs = ["".join(letters[(i + d) % 5] for d in range(len(c))) if per_token else letters[i]
            for i, c in enumerate(cands)]
    assert plan(cands, srcs, model, cost, budget, classes) == reference_plan(cands, srcs, model, cost, budget, classes)


def test_plan_refuses_classes_that_do_not_fit_the_candidates():
    with pytest.raises(ValueError, match="classes must hold one confidence class per candidate token"):
        plan([(1, 2), (3,)], ["W", "S"], AcceptanceModel(), FLAT, 4, [(0, 1)])
    with pytest.raises(ValueError, match="classes must hold one confidence class per candidate token"):
        plan([(1, 2), (3,)], ["W", "S"], AcceptanceModel(), FLAT, 4, [(0,), (0,)])


@pytest.mark.parametrize("cost", [STEEP, VerifyCost([1, 9], [10.0, 14.0]), VerifyCost([1, 2, 5], [10.0, 10.5, 20.0])])
def test_draft_threshold_is_exact(cost):
    """Below the threshold no K pays; just above the K = 1 bound, one node does (on these curves)."""
    t = cost.table
    for budget in (1, 4, 8, 28):
        thr = cost.draft_threshold(budget)
        assert thr == pytest.approx(min((t[k + 1] / t[1] - 1) / k for k in range(1, budget + 1)), rel=1e-6)
        for k in range(1, budget + 1):
            assert (1 + k * thr) / t[k + 1] < 1 / t[1]
    p = (t[2] / t[1] - 1) * 1.01  # a node just likely enough to pay for one more verified token
    model = AcceptanceModel()
    for _ in range(1000):
        model.record("W", False, True)  # alpha(W, first) -> ~1: drafted whenever K = 1 pays
    if p < 1:
        assert plan([(1,)], ["W"], model, cost, budget=1) == ([(1,)], ["W"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), max_size=5).map(tuple), min_size=1, max_size=6),
       st.lists(st.sampled_from("WSL"), min_size=6, max_size=6), st.integers(1, 12),
       st.lists(st.tuples(st.sampled_from("WSL"), st.booleans(), st.integers(0, 6)), max_size=12),
       st.booleans(), st.sampled_from([STEEP, VerifyCost([1, 9], [10.0, 14.0]), VerifyCost([1, 2, 5], [10.0, 10.5, 20.0])]))
def test_plan_early_exit_equals_the_node_by_node_trie(cands, letters, budget, history, per_token, cost):
    """Mostly rejected stores (the early exit's case), empty candidates and duplicates included."""
    model = AcceptanceModel()
    for store, alt, rejections in history:
        model.record(store, alt, True)
        for _ in range(rejections):
            model.record(store, alt, False)
    srcs = ["".join(letters[(i + d) % 6] for d in range(len(c))) if per_token else letters[i]
            for i, c in enumerate(cands)]
    assert plan(cands, srcs, model, cost, budget) == reference_plan(cands, srcs, model, cost, budget)


def test_fit_keeps_the_step_from_one_token_to_two():
    """HF on a CPU: q = 1 runs matrix-vector products, q >= 2 GEMMs (a step up); one line through every
    point would make a 2-token verification look nearly free, the split curve keeps it dear."""

    def hf_curve(qs, ms):
        return fit_verify_cost(qs, ms, first_point_apart=True)

    qs, ms = [1, 2, 3, 5, 9], [100.0, 170.0, 180.0, 200.0, 230.0]
    line = fit_verify_cost(qs, ms)
    split = hf_curve(qs, ms)
    assert split.relative(1) == 1.0 and split(1) == 100.0
    assert split.relative(2) > 1.6 > line.relative(2)  # the line hides the step
    assert np.all(np.diff(split(np.arange(1, 30))) >= 0)  # never cheaper for more tokens
    # a noisy q >= 2 point below q = 1 cannot make verification cheaper than one token
    low = hf_curve([1, 2, 3], [100.0, 60.0, 70.0])
    assert min(low.ms) == 100.0
    # where the split cannot apply (two points, or no q = 1 point first) it is the one line
    assert hf_curve([1, 9], [10.0, 13.0]).ms == fit_verify_cost([1, 9], [10.0, 13.0]).ms
    # noisy timings that fall with q: the fitted line is flat, never decreasing
    flat = fit_verify_cost([1, 2, 3], [12.0, 11.0, 10.0])
    assert np.all(np.diff(flat.ms) >= 0) and flat(3) == pytest.approx(11.0)
    with pytest.raises(ValueError, match="ms must be finite"):
        fit_verify_cost([1, 2], [1.0, -1.0])


def test_observe_of_a_chain_counts_the_accepted_prefix_and_the_first_miss():
    m = AcceptanceModel(half_life=float("inf"))
    observe(m, [(1, 2, 3, 4)], ["WWSS"], accepted=[1, 2], classes=[(0, 1, 2, 3)])
    # tested: 1 and 2 (accepted), 3 (the first miss); 4's parent was rejected, so 4 was never tested
    assert m.tried == {("W", False, 0): 1, ("W", False, 1): 1, ("S", False, 2): 1}
    assert {k: v for k, v in m.accepted.items() if v} == {("W", False, 0): 1, ("W", False, 1): 1}
    full = AcceptanceModel(half_life=float("inf"))
    observe(full, [(5, 6)], ["L"], accepted=[5, 6])  # all accepted: every node tested and right
    assert full.tried == {("L", False, 0): 2} and full.accepted == {("L", False, 0): 2}
