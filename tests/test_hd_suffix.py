"""L as REST builds it: the suffix store against brute force, its files and bad input."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.hd import StoreFileError, SuffixStore


def brute_longest(docs, ctx, depth, length):
    """Longest suffix of ctx (<= depth) occurring in docs, and the counts of what follows it."""
    for m in range(min(depth, len(ctx)), 0, -1):
        suf = list(ctx[-m:])
        counts, found = Counter(), False
        for d in docs:
            d = list(d)
            for i in range(len(d) - m + 1):
                if d[i:i + m] == suf:
                    found = True
                    cont = tuple(d[i + m:i + m + length])
                    if cont:
                        counts[cont] += 1
        if found:
            return m, counts
    return 0, Counter()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), min_size=0, max_size=25), min_size=1, max_size=5),
       st.lists(st.integers(0, 4), min_size=1, max_size=10), st.integers(1, 3))
def test_suffix_store_matches_brute_force(docs, ctx, length):
    if not any(docs):
        docs = [[0]]
    store = SuffixStore.build(docs, vocab_size=5, length=length, max_samples=10_000, memo=0)
    m, counts = brute_longest(docs, ctx, store.depth, length)
    ranges = list(store._longest_first(tuple(ctx)))
    assert (ranges[0][0] if ranges else 0) == m
    if m:
        ranked = store._ranked(*ranges[0])
        assert set(ranked) == set(counts)
        got = [counts[c] for c in ranked]
        assert got == sorted(got, reverse=True)  # most frequent first
        assert store.lookup(ctx, 100)[:len(ranked)] == ranked


def test_suffix_store_longest_match_and_boundaries():
    docs = [[1, 2, 3, 4, 5], [9, 2, 3, 7], [2, 3, 7, 8], [3, 7, 8]]
    s = SuffixStore.build(docs, vocab_size=10, length=2)
    assert s.lookup([1, 2, 3], 3)[0] == (4, 5)  # the 3-token match beats the more frequent (2, 3) -> 7
    assert s.lookup([5], 3) == []  # a document's last token: nothing follows, documents never run together
    assert s.lookup([6], 3) == [] and s.lookup([123], 3) == []  # absent / out-of-vocabulary ids match nothing
    assert s.lookup([3], 3) == [(7, 8), (4, 5), (7,)]  # most frequent first; ties in index order


def test_suffix_store_files_and_errors(tmp_path):
    tok = {"name": "t", "vocab_size": 10, "sha256": "a" * 64}
    s = SuffixStore.build([[1, 2, 3, 4], [2, 3, 5]], meta={"kind": "statistics", "tokenizer": tok})
    path = s.save(tmp_path / "L.npz")
    back = SuffixStore.load(path, expect_tokenizer=tok)
    assert back.lookup([2, 3], 3) == s.lookup([2, 3], 3) and back.n_tokens == 7
    with pytest.raises(StoreFileError, match="meta.tokenizer"):
        SuffixStore.load(path, expect_tokenizer={**tok, "sha256": "b" * 64})
    with pytest.raises(StoreFileError, match="over the budget"):
        SuffixStore.load(path, max_bytes=10)
    z = dict(np.load(path))
    z["order"] = z["order"][:-1]
    np.savez(tmp_path / "bad.npz", **z)
    with pytest.raises(StoreFileError, match="order") as err:
        SuffixStore.load(tmp_path / "bad.npz")
    assert err.value.field == "order"
    with pytest.raises(ValueError, match="vocabulary"):
        SuffixStore.build([[1, 12]], vocab_size=10)
    with pytest.raises(ValueError, match="at least one non-empty"):
        SuffixStore.build([[], []])


def brute_lookup(docs, ctx, depth, length, k):
    """REST's answer by brute force: suffixes longest first, continuations by count (ties: first occurrence in
    suffix-array order, i.e. sorted by the tokens that follow), distinct, until ``k``."""
    out = []
    for m in range(min(depth, len(ctx)), 0, -1):
        suf = list(ctx[-m:])
        occ = []
        for d in docs:
            d = list(d)
            for i in range(len(d) - m + 1):
                if d[i:i + m] == suf:
                    occ.append((d[i + m:] + [-1] * 40, tuple(d[i + m:i + m + length])))
        if not occ:
            continue
        occ.sort(key=lambda x: x[0])  # the suffix array's order of these occurrences
        counts = Counter(c for _, c in occ)
        for c in sorted(counts, key=lambda c: -counts[c]):
            if c and c not in out:
                out.append(c)
        if len(out) >= k:
            break
    return out[:k]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=30), min_size=1, max_size=4),
       st.lists(st.integers(0, 4), min_size=1, max_size=12), st.integers(1, 3), st.integers(1, 6))
def test_suffix_lookup_tops_up_with_shorter_suffixes_and_memo_is_exact(docs, ctx, length, k):
    store = SuffixStore.build(docs, vocab_size=5, length=length, max_samples=10_000)
    want = brute_lookup(docs, ctx, store.depth, length, k)
    assert store.lookup(ctx, k) == want
    assert store.lookup(ctx, k) == want  # memoised answer
    assert store.lookup(ctx, 1) == want[:1]  # a smaller k from the memo
    assert store.lookup(ctx, k + 2) == brute_lookup(docs, ctx, store.depth, length, k + 2)  # a larger k is recomputed


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=20, max_size=80), min_size=1, max_size=4),
       st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=10), min_size=1, max_size=6),
       st.lists(st.integers(1, 9), min_size=1, max_size=6), st.integers(3, 20))
def test_suffix_memos_answer_as_a_fresh_store_whatever_was_asked_before(docs, ctxs, ks, max_samples):
    # long match ranges (a 3-token alphabet) take the vectorised, sampled ranking path too
    store = SuffixStore.build(docs, vocab_size=4, length=3, max_samples=max_samples)
    for ctx in ctxs:
        for k in ks:
            fresh = SuffixStore.build(docs, vocab_size=4, length=3, max_samples=max_samples, memo=0)
            assert store.lookup(ctx, k) == fresh.lookup(ctx, k)
