"""HD databases and drafters without a model: n-gram tables against brute force, the W store's LRU,
PLD's first-match rule, the hierarchy's stop rule and counters, files and bad input."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.hd import (
    ContextStore,
    HierarchyDrafter,
    NGramTable,
    PLDDrafter,
    StoreFileError,
    build_tree,
    check_order,
    load_store,
    tokenizer_identity,
)
from moelab.hd.methods import METHODS, get_method, make_hf_drafter
from moelab.make.hd_stores import build_statistics_store


class WordTokenizer:
    """A real (if tiny) whitespace tokenizer with the interface the stores use: a test fixture."""

    def __init__(self, words: list[str], name: str = "words") -> None:
        self.vocab = {w: i for i, w in enumerate(words)}
        self.name_or_path = name

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    def __call__(self, texts, add_special_tokens: bool = False):
        return {"input_ids": [[self.vocab[w] for w in t.split() if w in self.vocab] for t in texts]}


def brute_force(seqs, m, length):
    counts = Counter()
    for s in seqs:
        for i in range(len(s) - m - length + 1):
            counts[tuple(s[i:i + m + length])] += 1
    return counts


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=30), min_size=1, max_size=4),
       st.integers(1, 3), st.integers(1, 3), st.integers(1, 2))
def test_ngram_table_matches_brute_force(seqs, length, per_key, min_count):
    table = NGramTable.build(seqs, key_lengths=(1, 2), length=length, per_key=per_key, min_count=min_count)
    for m in (2, 1):
        counts = brute_force(seqs, m, length)
        keys = {k[:m] for k in counts}
        for key in keys:
            conts = {k[m:]: c for k, c in counts.items() if k[:m] == key and c >= min_count}
            if not conts:
                continue
            got = table.tables[m]
            row = [i for i in range(got[0].shape[0]) if tuple(got[0][i]) == key]
            assert len(row) == 1
            stored = [(tuple(c), int(n)) for c, n in zip(got[1][row[0]], got[2][row[0]]) if c[0] >= 0]
            # the stored continuations are the most frequent ones, in non-increasing count order
            assert [n for _, n in stored] == sorted(conts.values(), reverse=True)[:per_key]
            assert all(conts[c] == n for c, n in stored)


def test_lookup_longest_key_first_and_distinct():
    seqs = [[1, 2, 3, 4, 5, 6], [9, 2, 3, 7, 7, 7], [1, 2, 3, 4, 5, 6]]
    table = NGramTable.build(seqs, key_lengths=(1, 2), length=2, per_key=3)
    # key (1, 2) -> (3, 4) twice; key (2,) -> (3, 4) x2 and (3, 7) x1: the 2-token key wins, no duplicates
    assert table.lookup([0, 1, 2], k=5) == [(3, 4), (3, 7)]
    assert table.lookup([0, 9, 2], k=1) == [(3, 7)]
    assert table.lookup([42], k=5) == []
    assert table.lookup([], k=5) == []


def test_max_ngrams_keeps_the_most_frequent():
    seqs = [[0, 1, 2] * 5 + [3, 4, 5]]
    table = NGramTable.build(seqs, key_lengths=(1,), length=2, max_ngrams=3)
    assert table.n_ngrams == 3
    assert table.lookup([3]) == []  # (3, 4, 5) occurs once: dropped
    assert table.lookup([0]) == [(1, 2)]


def test_store_files_roundtrip_and_errors(tmp_path):
    tok = WordTokenizer("a b c d e f the cat sat on mat".split())
    texts = ["the cat sat on the mat", "the cat sat on the mat", "a b c d e f"]
    table = build_statistics_store(texts, tok, length=3, min_count=1)
    path = table.save(tmp_path / "L.npz")
    back = load_store(path, tok, "statistics")
    ctx = [tok.vocab["the"], tok.vocab["cat"]]
    assert back.lookup(ctx) == table.lookup(ctx) == [(tok.vocab["sat"], tok.vocab["on"], tok.vocab["the"])]
    assert back.meta["tokenizer"] == tokenizer_identity(tok)
    other = WordTokenizer("a b c d e f the cat sat on rug".split(), name="other")
    with pytest.raises(ValueError, match="built for tokenizer"):
        load_store(path, other)
    with pytest.raises(ValueError, match="not a 'model' store"):
        load_store(path, tok, "model")
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, x=np.arange(3))
    with pytest.raises(StoreFileError, match="foreign.npz: format"):
        load_store(foreign, tok)
    meta = np.array(json.dumps({"kind": "statistics", "tokenizer": tokenizer_identity(tok)}))
    np.savez(foreign, format=np.array("moelab.hd.ngram/1"), meta=meta, length=np.array(3),
             keys1=np.zeros((2, 1), np.int32), conts1=np.zeros((3, 7, 3), np.int32), counts1=np.zeros((3, 7), np.int32))
    with pytest.raises(StoreFileError, match="shapes disagree") as err:
        load_store(foreign, tok)
    assert err.value.field == "conts1" and err.value.path == foreign
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip file")
    with pytest.raises(ValueError):
        load_store(garbage, tok)
    with pytest.raises(ValueError, match="at least one non-empty"):
        build_statistics_store(["", "  "], tok)


def test_ngram_ids_beyond_21_bits_never_collide():
    table = NGramTable.build([[1, 2, 3, 4, 5]], key_lengths=(1, 2), length=2)
    # (1 << 21) + 1 would pack onto the same bits as 1 if ids were not range-checked at lookup
    assert table.lookup([(1 << 21) + 1]) == [] and table.lookup([1]) == [(2, 3)]
    with pytest.raises(ValueError, match="21 bits"):
        NGramTable.build([[1 << 21, 1, 2]], key_lengths=(1,), length=1)
    with pytest.raises(ValueError, match="vocab_size"):
        NGramTable.build([[1, 2, 3]], key_lengths=(1,), length=1, meta={"tokenizer": {"vocab_size": (1 << 21) + 1}})


def test_per_document_counting():
    seqs = [[7, 1, 7, 1, 7, 1, 7, 1], [7, 2]]
    assert NGramTable.build(seqs, key_lengths=(1,), length=1).lookup([7], 2) == [(1,), (2,)]
    t = NGramTable.build(seqs, key_lengths=(1,), length=1, per_document=True)
    row = int(np.flatnonzero(t.tables[1][0][:, 0] == 7)[0])
    assert t.tables[1][2][row].tolist()[:2] == [1, 1]  # (7, 1) counted once per document, like (7, 2)


def test_context_store_lru_and_incremental_updates():
    w = ContextStore(key_lengths=(1,), length=2, per_key=2)
    w.reset([5, 1, 2, 5, 3, 4])
    assert w.lookup([5]) == [(3, 4), (1, 2)]  # most recent first
    w.extend([5, 6, 7])
    assert w.lookup([5]) == [(6, 7), (3, 4)]  # (1, 2) evicted: least recently seen
    # incremental extension equals indexing everything at once
    once = ContextStore(key_lengths=(1, 2), length=3)
    once.reset([1, 2, 3, 1, 2, 4, 1, 2, 3, 9])
    inc = ContextStore(key_lengths=(1, 2), length=3)
    inc.reset([1, 2])
    for t in [3, 1, 2, 4, 1, 2, 3, 9]:
        inc.extend([t])
    for ctx in ([1], [2], [1, 2], [3], [7]):
        assert once.lookup(ctx) == inc.lookup(ctx)


def test_pld_first_match_longest_ngram():
    d = PLDDrafter(max_ngram=3, num_pred_tokens=3)
    d.start([7, 8, 9, 1, 2, 7, 8, 9, 3, 4, 7, 8, 9])
    draft = d.draft()
    assert draft.candidates == [(1, 2, 7)] and draft.sources == ["P"]  # first occurrence of (7, 8, 9)
    d.start([1, 2, 3])
    assert d.draft().candidates == []
    assert d.counters["P"].queries == 2 and d.counters["P"].lookup_hits == 1


def pld_reference(ids, max_ngram=3, num_pred=10):
    """Direct port of prompt lookup decoding's search loop (first match, longest n-gram first)."""
    n = len(ids)
    for size in range(max_ngram, 0, -1):
        ngram = ids[n - size:]
        for idx in range(0, n - size + 1):
            if ids[idx:idx + size] == ngram and idx + size < n - size:
                return tuple(ids[idx + size:idx + size + num_pred])
    return None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40))
def test_pld_matches_reference_loop(ids):
    d = PLDDrafter()
    d.start(ids)
    got = d.draft().candidates
    want = pld_reference(ids)
    assert got == ([] if want is None else [want])


def test_hierarchy_walks_stores_in_order_and_stops_early():
    S = NGramTable.build([[4, 10, 11, 12, 13], [4, 20, 21, 22, 23]], key_lengths=(1,), length=4)
    L = NGramTable.build([[4, 30, 31, 32, 33]], key_lengths=(1,), length=4)
    prompt = [4, 1, 2, 3, 5, 4]
    d = HierarchyDrafter(S, L, order="WSL", max_candidates=2, length=4)
    d.start(prompt)
    draft = d.draft()
    assert draft.sources == ["W", "S"] and draft.candidates[0] == (1, 2, 3, 5)
    assert d.counters["L"].queries == 0  # enough candidates before L
    d2 = HierarchyDrafter(S, L, order="LSW", max_candidates=7, length=2)
    d2.start(prompt)
    draft = d2.draft()
    assert draft.sources == ["L", "S", "S", "W"] and all(len(c) == 2 for c in draft.candidates)
    d2.credit("S", 2)
    assert d2.counters["S"].accepted_tokens == 2 and d2.counters["S"].lookup_hits == 1


def test_build_tree_merges_shared_prefixes():
    tree = build_tree(9, [(1, 2, 3), (1, 2, 4), (5,)], ["W", "S", "L"])
    assert tree.tokens.tolist() == [9, 1, 2, 3, 4, 5]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 2, 0]
    assert tree.sources == ["", "W", "W", "W", "S", "L"]


@pytest.mark.parametrize("order", ["", "WX", "WW", "wsl", 3, None])
def test_bad_orders(order):
    with pytest.raises(ValueError, match="order"):
        check_order(order)


def test_bad_drafter_inputs():
    with pytest.raises(ValueError, match="model_store"):
        HierarchyDrafter(None, None, order="S")
    with pytest.raises(ValueError, match="max_candidates"):
        HierarchyDrafter(order="W", max_candidates=0)
    with pytest.raises(ValueError, match="prompt_ids"):
        HierarchyDrafter(order="W").start([])
    with pytest.raises(ValueError, match="method must be one of"):
        get_method("HD(WQ)")
    # one table: a name and its result label are the same method; "HD-cost" is the cost-aware drafter everywhere
    assert get_method("HD-cost") is get_method("hd") is METHODS["hd"] and METHODS["hd"].display == "HD (cost-aware)"
    assert METHODS["hd_fixed"].display == "HD (paper, fixed)" and get_method("HD-fixed").name == "hd_fixed"
    with pytest.raises(ValueError, match="method must be one of"):  # plain "HD" is the paper's name, not a label
        get_method("HD")
    fixed = make_hf_drafter("hd_fixed", object(), object(), budget=8)  # stores are only read when drafting
    assert isinstance(fixed, HierarchyDrafter) and fixed.order == "WSL"
    with pytest.raises(ValueError, match="cost"):
        make_hf_drafter("hd", None, None, budget=8)  # cost-aware HD needs the verify-cost curve
    with pytest.raises(ValueError, match="HF runs"):
        make_hf_drafter("suffix", None, None)  # vLLM's own speculator


def reference_context_lookups(tokens, key_lengths, length, per_key, ctx, k):
    """W written with an ordered dict per key, the way the paper describes it: every n-gram re-inserted as most
    recent, the least recently seen evicted; lookup = longest key first, most recent first, distinct."""
    from collections import OrderedDict

    table = {}
    for end in range(length, len(tokens)):
        kend = end - length + 1
        cont = tuple(tokens[kend:end + 1])
        for m in sorted(set(key_lengths), reverse=True):
            if kend < m:
                continue
            bucket = table.setdefault(tuple(tokens[kend - m:kend]), OrderedDict())
            bucket[cont] = None
            bucket.move_to_end(cont, last=False)
            if len(bucket) > per_key:
                bucket.popitem(last=True)
    out = []
    for m in sorted(set(key_lengths), reverse=True):
        if len(ctx) < m:
            continue
        for c in table.get(tuple(ctx[len(ctx) - m:]), ()):
            if c not in out:
                out.append(c)
                if len(out) >= max(k, 1):
                    return out
    return out


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=60), st.lists(st.integers(1, 5), min_size=1, max_size=8),
       st.sampled_from([(1,), (2,), (1, 2), (1, 2, 3)]), st.integers(1, 4), st.integers(1, 4), st.integers(1, 9))
def test_context_store_equals_the_ordered_dict_reference(tokens, chunks, key_lengths, length, per_key, k):
    w = ContextStore(key_lengths, length=length, per_key=per_key)
    w.reset(tokens[:chunks[0]])
    pos = chunks[0]
    for size in [*chunks[1:], len(tokens)]:  # extended in steps of several tokens, as accept() does
        w.extend(tokens[pos:pos + size])
        pos += size
        seen = tokens[:pos]
        for ctx in (seen, seen[-1:], [0], [1, 2]):
            assert w.lookup(ctx, k) == reference_context_lookups(seen, key_lengths, length, per_key, ctx, k)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), min_size=2, max_size=40), min_size=1, max_size=5),
       st.lists(st.integers(0, 4), min_size=1, max_size=4), st.permutations([1, 2, 3, 5, 7, 20]))
def test_ngram_lookup_is_the_same_whatever_k_callers_asked_for_before(seqs, ctx, ks):
    table = NGramTable.build(seqs, key_lengths=(1, 2), length=2, per_key=4)
    for k in ks:  # the memo holds the full answer: any k is its first k, in any order of calls
        want = table._lookup(tuple(ctx[-2:]), k)  # computed for exactly this k, no memo
        assert table.lookup(ctx, k) == want and len(want) <= k
