"""HD's per-step fast paths give exactly what the public calls they stand for give (issue 41).

The drafter reads a store's answer and its match length in one probe (``lookup_matched``), plans through
``policy._plan`` (no argument checks; the kept candidates' classes from the tree pass), and an n-gram table
answers a tail only as far as asked. Each is compared here with the plain calls on random inputs.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from moelab.costmodel.verify import VerifyCost
from moelab.hd import NGramTable, SuffixStore
from moelab.hd.drafters import Draft, HierarchyDrafter, _kept_classes
from moelab.hd.policy import AcceptanceModel, PolicyChoice, _plan, plan
from moelab.hd.rows import RowDrafters
from moelab.hd.stores import ContextStore

COSTS = (VerifyCost([1, 2, 3, 5, 9], [10.0, 14.0, 15.0, 17.0, 20.0]), VerifyCost([1, 2, 9], [10.0, 10.0, 10.0]),
         VerifyCost([1, 2, 3], [10.0, 20.0, 30.0]))


def _contexts(rng: np.random.Generator, vocab: int, n: int = 600) -> list[list[int]]:
    return [rng.integers(0, vocab, size=int(rng.integers(0, 10))).tolist() for _ in range(n)]


def _reference_w_lookup(w: ContextStore, ctx: list[int], k: int) -> list[tuple[int, ...]]:
    """W's lookup as specified, written out plainly: every key length, longest first, that has continuations;
    its continuations most recent first; no repeats; the first key's answer whole up to max(k, 1), then up to k."""
    out: list[tuple[int, ...]] = []
    first = True
    for m in sorted(w.key_lengths, reverse=True):
        if len(ctx) < m:
            continue
        for c in w._table.get(tuple(ctx[len(ctx) - m:]), []):
            if len(out) >= (max(k, 1) if first else k):
                break
            if c not in out:
                out.append(c)
        first = first and not out
    return out


def test_context_store_lookup_matched_is_lookup_and_match_length():
    rng = np.random.default_rng(0)
    w = ContextStore((1, 2, 3), length=3, per_key=3)
    w.reset(rng.integers(0, 6, size=300).tolist())
    for ctx in _contexts(rng, 7):
        for k in (0, 1, 3, 7):
            got = w.lookup(ctx, k)
            assert got == _reference_w_lookup(w, ctx, k), (ctx, k)  # lookup is lookup_matched's first half
            assert w.lookup_matched(ctx, k) == (got, w.match_length(ctx) if got else 0)


def test_suffix_store_lookup_matched_is_lookup_and_match_length():
    rng = np.random.default_rng(1)
    store = SuffixStore.build([rng.integers(0, 20, size=int(rng.integers(3, 60))).tolist() for _ in range(80)],
                              vocab_size=20)
    for ctx in _contexts(rng, 21):
        for k in (1, 3, 7):
            got = store.lookup(ctx, k)
            assert store.lookup_matched(ctx, k) == (got, store.match_length(ctx) if got else 0)
    with pytest.raises(ValueError, match="context must hold integer token ids"):
        store.lookup_matched([1.5, 2], 3)


def test_ngram_answers_as_far_as_asked_are_the_full_answers_prefix():
    """Whatever order of k the memo sees (a partial entry completed later), every answer is what a table that
    has seen nothing gives for that context and k (k >= 0; a negative k slices, memo-dependent as it always was)."""
    rng = np.random.default_rng(2)
    docs = [rng.integers(0, 12, size=int(rng.integers(4, 40))).tolist() for _ in range(60)]
    table = NGramTable.build(docs, key_lengths=(1, 2, 3), length=3, per_key=4)
    for ctx in _contexts(rng, 13, 300):
        for k in rng.choice([0, 1, 2, 3, 5, 9], size=4).tolist():
            fresh = NGramTable(table.length, table.tables, table.meta)
            assert table.lookup(ctx, k) == fresh.lookup(ctx, k)


def _model(kind: str, r: random.Random) -> AcceptanceModel:
    class Counting(AcceptanceModel):  # another model: plan asks it through alphas()
        def alphas(self, store, cls=0):
            self.asked.append((store, cls))
            return super().alphas(store, cls)

    m = AcceptanceModel(r.choice([0.1, 0.5, 0.9])) if kind == "plain" else Counting(r.choice([0.1, 0.5, 0.9]))
    m.asked = []
    for _ in range(r.randrange(40)):
        m.record(r.choice("WSL"), r.random() < 0.3, r.random() < 0.5, r.randrange(16))
    return m


@pytest.mark.parametrize("seed", range(4))
def test_the_drafters_plan_entry_is_plan_with_the_kept_classes(seed):
    r = random.Random(seed)
    for _ in range(1500):
        cands: list[tuple[int, ...]] = []
        for _ in range(r.randrange(1, 7)):
            c = tuple(r.randrange(3) for _ in range(r.randrange(0, 6)))
            if cands and r.random() < 0.3:
                c = r.choice(cands)[:r.randrange(4)] + c
            cands.append(c)
        srcs = ["".join(r.choice("WSL") for _ in c) if len(c) > 1 and r.random() < 0.2 else r.choice("WSL")
                for c in cands]
        classes = [tuple(r.randrange(16) for _ in c) for c in cands]
        cost, budget, kind, state = r.choice(COSTS), r.choice([1, 2, 4, 8, 28]), r.choice(["plain", "counting"]), r.random()
        m1, m2 = _model(kind, random.Random(state)), _model(kind, random.Random(state))
        expected = plan(cands, srcs, m1, cost, budget, classes)
        got = _plan(cands, srcs, classes, m2, cost, budget, True)
        assert got[:2] == expected
        assert got[2] == _kept_classes(expected[0], Draft(cands, srcs, classes))
        assert m1.asked == m2.asked  # another model is asked the same alphas, in the same order


def test_policy_choice_inline_rates_choose_as_best_does():
    class Plain(PolicyChoice):  # a subclass takes best(); the class itself compares the rates inline
        pass

    r = random.Random(5)
    a, b = PolicyChoice(warmup=3, explore=0.2), Plain(warmup=3, explore=0.2)
    for _ in range(2000):
        u = r.random()
        assert a.choose(u) == b.choose(u)
        arm, tokens, seconds = r.randrange(2), r.choice([0.0, 1.0, 4.0]), r.choice([0.0, 0.05, 0.2])
        a.record(arm, tokens, seconds)
        b.record(arm, tokens, seconds)


def test_a_row_keeps_its_request_when_the_engine_changes_the_array_dtype():
    rows = RowDrafters(lambda: HierarchyDrafter(order="W", length=2), lambda d, m: d.draft_chain(m))
    toks = [4, 5, 6, 4, 5, 6, 4]
    assert rows.propose(0, np.array(toks, dtype=np.int64), 2) == [5, 6]
    assert rows.propose(0, np.array(toks + [5], dtype=np.int32), 2) == [6, 4]  # same tokens: the row is kept
    assert rows.stats.resets == 0 and rows.stats.accepted_tokens == 0  # (the bonus token is not an accepted one)
    assert rows.propose(0, np.array([9] + toks, dtype=np.int32), 2) == [5, 6]  # another request: reset
    assert rows.stats.resets == 1
