"""HD's proposals are the same before and after the per-call speed work (issue 28, deliver 2).

``_Before`` is ``HierarchyDrafter`` with its chain walk and token checks as they were (the whole context
copied per step, every step's tokens through ``check_token_ids``), frozen here, with the confidence classes
of every chain token (the store's match length and the token's position in its answer) added the plain way. The same requests are served
through per-row drafters built on it and on today's drafter (vLLM's path: ``RowDrafters.propose``, greedy
verification against a known output), hierarchy-fixed and cost-aware, over real W, S and L stores on a
phrase corpus; every proposed chain and every store counter must be equal.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from moelab._validate import check_int, check_token_ids
from moelab.costmodel.verify import VerifyCost
from moelab.hd import HierarchyDrafter, NGramTable, SuffixStore
from moelab.hd.drafters import CostAwareDrafter, Draft, _token_list
from moelab.hd.policy import confidence_class
from moelab.hd.rows import RowDrafters
from moelab.hd.stores import match_length
from tests.helpers import greedy_chains

VOCAB = 3000
BUDGET = 8


def _corpus(seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, VOCAB, size=int(n)).tolist() for n in rng.integers(3, 20, size=80)]
    return [[t for i in rng.zipf(1.4, size=40) % len(phrases) for t in phrases[i]] for _ in range(120)]


CORPUS = _corpus()
S = NGramTable.build(CORPUS[:60], key_lengths=(1, 2), length=4)
L = SuffixStore.build(CORPUS, vocab_size=VOCAB)


class _Before(HierarchyDrafter):
    """The drafter's per-step code before the speed work."""

    def start(self, prompt_ids: Sequence[int]) -> None:
        self.context = check_token_ids("prompt_ids", prompt_ids)
        if not self.context:
            raise ValueError("prompt_ids must not be empty")
        if "W" in self.order:
            self.W.reset(self.context)

    def accept(self, new_tokens: Sequence[int]) -> None:
        self.context.extend(check_token_ids("new_tokens", new_tokens))
        if "W" in self.order:
            self.W.extend(new_tokens)

    def draft_chain(self, max_len: int) -> Draft:
        check_int("max_len", max_len, low=1, high=256)
        ctx = list(self.context)
        chain: list[int] = []
        letters = ""
        classes: list[int] = []
        first = True
        while len(chain) < max_len:
            got = None
            for letter in self.order:
                if first:
                    c = self.counters[letter]
                    c.queries += 1
                cands = self._stores[letter].lookup(ctx, 1)
                if cands and cands[0]:
                    got = (cands[0], letter, match_length(self._stores[letter], ctx))
                    if first:
                        c.lookup_hits += 1
                        c.candidates += 1
                    break
            first = False
            if got is None:
                break
            seg = list(got[0][:max_len - len(chain)])
            chain.extend(seg)
            ctx.extend(seg)
            letters += got[1] * len(seg)
            classes += [confidence_class(got[2], i) for i in range(len(seg))]
        return Draft([tuple(chain)], [letters], [tuple(classes)]) if chain else Draft([], [], [])


class _Opaque:
    """A store of a type the drafter does not know: it may read the whole context (here: its length)."""

    def lookup(self, context: Sequence[int], k: int = 7) -> list[tuple[int, ...]]:
        return [(len(context) % VOCAB, 1)] if len(context) % 3 == 0 else []


def _serve(rows: RowDrafters, seed: int) -> list[tuple[int, ...]]:
    """Requests in 4 reused batch rows: a prompt (random phrases, then a stretch of a document) and the
    document's continuation as the target's greedy output; every proposed chain, in order."""
    rng = np.random.default_rng(seed)
    out = []
    for q in range(16):
        doc = CORPUS[int(rng.integers(len(CORPUS)))]
        prompt = rng.integers(0, VOCAB, int(rng.integers(1, 200))).tolist() + doc[:10]
        ref = doc[10:130] if q % 5 else rng.integers(0, VOCAB, 60).tolist()  # every fifth: drafts rejected
        out += greedy_chains(rows, q % 4, prompt, ref, np.int32 if q % 2 else np.int64,
                             lambda: int(rng.integers(0, BUDGET + 1)))
    return out


def _rows(cls: type[HierarchyDrafter], kind: str, order: str) -> tuple[RowDrafters, list[HierarchyDrafter]]:
    made: list[HierarchyDrafter] = []
    stores = {"S": _Opaque() if kind == "opaque" else S, "L": L}

    def inner() -> HierarchyDrafter:
        d = cls(stores["S"], stores["L"], order=order, length=4)
        made.append(d)
        return d

    if kind == "cost":
        cost = VerifyCost([1, 9], [10.0, 11.0])
        return RowDrafters(lambda: CostAwareDrafter(inner(), cost, budget=BUDGET, chain=True),
                           lambda d, m: d.draft(m)), made
    return RowDrafters(inner, lambda d, m: d.draft_chain(m)), made


@pytest.mark.parametrize("kind,order", [("fixed", "WSL"), ("fixed", "LSW"), ("fixed", "W"), ("cost", "WSL"),
                                        ("opaque", "WSL")])
def test_proposals_and_counters_identical_to_before(kind, order):
    new_rows, new_made = _rows(HierarchyDrafter, kind, order)
    old_rows, old_made = _rows(_Before, kind, order)
    new, old = _serve(new_rows, 5), _serve(old_rows, 5)
    assert new == old
    assert sum(map(len, new)) > 100  # it drafted (the comparison is not between two empty runs)
    assert [{k: vars(c) for k, c in d.counters.items()} for d in new_made] == \
        [{k: vars(c) for k, c in d.counters.items()} for d in old_made]
    assert vars(new_rows.stats).keys() == vars(old_rows.stats).keys()
    assert (new_rows.stats.drafted_tokens, new_rows.stats.accepted_tokens, new_rows.stats.resets) == \
        (old_rows.stats.drafted_tokens, old_rows.stats.accepted_tokens, old_rows.stats.resets)


@pytest.mark.parametrize("values", [[], [0, 5, 7], [3, -1], [1 << 63], [(1 << 63) - 1, 2], [True, 2], [2.0],
                                    np.array([1, 2]), (4, 5), [np.int64(3)], ["a"], [None]])
def test_token_list_is_check_token_ids(values):
    """The hot path's token check returns what ``check_token_ids`` returns, or raises as it does."""
    try:
        want = check_token_ids("new_tokens", values)
    except ValueError as exc:
        with pytest.raises(ValueError) as got:
            _token_list("new_tokens", values)
        assert str(got.value) == str(exc)
    else:
        got = _token_list("new_tokens", values)
        assert got == want and all(type(t) is int for t in got)
        assert got is not values  # a copy: the drafter's context never aliases the caller's list


def test_draft_chain_max_len_still_checked():
    d = HierarchyDrafter(S, L, order="WSL")
    d.start([1, 2, 3])
    for bad in (0, 257, 2.5):
        with pytest.raises(ValueError, match="max_len"):
            d.draft_chain(bad)
    assert d.draft_chain(np.int64(3)) == _Before(S, L, order="WSL").__class__.draft_chain(d, 3)
