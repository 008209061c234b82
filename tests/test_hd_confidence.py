"""Confidence classes: a draft token's store match length and position decide which acceptance rate it gets."""

from __future__ import annotations

import pytest

from moelab.costmodel.verify import VerifyCost
from moelab.hd import HierarchyDrafter, NGramTable, SuffixStore
from moelab.hd.drafters import COST_AWARE_CONTEXT_KEYS, CostAwareDrafter
from moelab.hd.policy import MATCH_CLASSES, POSITION_CLASSES, AcceptanceModel, confidence_class, observe, plan
from moelab.hd.stores import ContextStore, match_length

CHEAP = VerifyCost([1, 9], [10.0, 14.0])


def test_confidence_class_separates_match_length_and_position_and_caps_both():
    seen = {confidence_class(m, p) for m in range(MATCH_CLASSES) for p in range(POSITION_CLASSES)}
    assert len(seen) == MATCH_CLASSES * POSITION_CLASSES  # every (match, position) pair its own class
    assert confidence_class(MATCH_CLASSES + 5, POSITION_CLASSES + 7) == confidence_class(MATCH_CLASSES - 1,
                                                                                          POSITION_CLASSES - 1)


def test_context_store_match_length_is_the_longest_key_with_continuations():
    w = ContextStore((1, 2, 3), length=2)
    w.reset([1, 2, 3, 4, 5, 9, 3, 4])
    assert w.match_length([7, 7, 12]) == 0  # no key ends the context
    assert w.match_length([2, 3]) == 2 and w.match_length([1, 2, 3]) == 3  # [1 2 3] -> [4 5]
    assert w.match_length([8, 3]) == 1  # only the key [3] was seen
    assert w.match_length([]) == 0


def test_suffix_store_match_length_is_the_longest_occurring_suffix():
    L = SuffixStore.build([[1, 2, 3, 4, 5], [2, 3, 9]], vocab_size=16)
    assert L.match_length([1, 2, 3]) == 3 and L.match_length([7, 2, 3]) == 2 and L.match_length([7, 7, 3]) == 1
    assert L.match_length([11]) == 0
    L.lookup([1, 2, 3], 2)  # the answer memoised by a lookup gives the same length
    assert L.match_length([1, 2, 3]) == 3


def test_a_store_that_does_not_say_gets_match_length_zero():
    S = NGramTable.build([[1, 2, 3, 4, 5, 6]], key_lengths=(1, 2), length=2)
    assert match_length(S, [1, 2]) == 0


def test_chain_classes_follow_each_lookup():
    # W knows [5 6] -> [7 8 9 10] after a 2-token key; the chain's first answer is W's, its tokens at positions 0..3
    d = HierarchyDrafter(None, None, order="W", length=4, context_key_lengths=COST_AWARE_CONTEXT_KEYS)
    d.start([1, 5, 6, 7, 8, 9, 10, 2, 5, 6])
    draft = d.draft_chain(4)
    assert draft.candidates == [(7, 8, 9, 10)] and draft.sources == ["WWWW"]
    assert draft.classes == [tuple(confidence_class(2, i) for i in range(4))]
    tree = d.draft()
    assert tree.classes == [tuple(confidence_class(2, i) for i in range(len(c))) for c in tree.candidates]


def test_plan_keeps_a_confident_class_longer_and_observe_learns_per_class():
    m = AcceptanceModel(0.5, half_life=float("inf"))
    hi, lo = confidence_class(3, 0), confidence_class(1, 0)
    for _ in range(200):
        observe(m, [(1,)], ["W"], [1], [(hi,)])  # 3-token keys: always accepted
        observe(m, [(1,)], ["W"], [], [(lo,)])  # 1-token keys: never
    assert m.alpha("W", False, hi) > 0.98 and m.alpha("W", False, lo) < 0.02
    chain = [(1, 2, 3, 4)]
    assert plan(chain, ["WWWW"], m, CHEAP, 8, [(hi,) * 4]) == (chain, ["WWWW"])
    assert plan(chain, ["WWWW"], m, CHEAP, 8, [(lo,) * 4]) == ([], [])


def test_cost_aware_chain_observes_the_kept_prefix_classes():
    d = CostAwareDrafter(HierarchyDrafter(None, None, order="W", length=4, context_key_lengths=COST_AWARE_CONTEXT_KEYS),
                         CHEAP, budget=8, chain=True, acceptance=AcceptanceModel(0.9, half_life=float("inf")),
                         explore=0.0)
    d.start([1, 5, 6, 7, 8, 9, 10, 2, 5, 6])
    draft = d.draft(8)
    assert draft.candidates and draft.classes == [tuple(draft.classes[0])]
    n = len(draft.candidates[0])
    d.observe(draft, list(draft.candidates[0][:2]))  # two accepted, the third rejected
    tried = {k: v for k, v in d.acceptance.tried.items()}
    assert sum(tried.values()) == pytest.approx(min(3, n))
    assert all(k[2] in draft.classes[0][:3] for k in tried)
