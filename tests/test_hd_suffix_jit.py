"""The suffix store's compiled queries (``moelab.hd._suffix_jit``) give exactly the Python ones
(``SuffixStore._suffix_ranges_py``, ``SuffixStore._ranked_py``): random corpora over small and large
vocabularies (one or several tokens per packed word), suffixes longer than one word, ids outside the packed
range, sampled and exhaustive rankings, continuations cut at document boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from moelab.hd import SuffixStore


def _store(rng: np.random.Generator, vocab: int, **kw) -> SuffixStore:
    phrases = [rng.integers(0, vocab, size=int(n)).tolist() for n in rng.integers(2, 9, size=30)]
    docs = [[t for i in rng.integers(0, len(phrases), size=int(rng.integers(1, 12))) for t in phrases[i]]
            for _ in range(60)]
    return SuffixStore.build(docs, vocab_size=vocab, **kw)


@pytest.mark.parametrize("vocab,kw", [(5, {}), (40, {"length": 3, "max_samples": 4}), (3000, {}),
                                      (70000, {"length": 6, "max_samples": 7}), (200, {"max_samples": 1})])
def test_compiled_queries_are_the_python_ones(vocab, kw):
    rng = np.random.default_rng(vocab)
    store = _store(rng, vocab, **kw)
    top = 1 << store.bits
    odd = [-1, -5, top - 1, top, 1 << 70]  # ids no stored suffix holds
    tokens = store.tokens[store.tokens >= 0]
    seen_long = 0
    for _ in range(400):
        n = int(rng.integers(0, store.depth + 1))
        if rng.random() < 0.7 and tokens.size > n:  # a real stretch of the corpus: long suffixes match
            start = int(rng.integers(0, tokens.size - n))
            key = [int(t) for t in tokens[start:start + n]]
        else:
            key = [int(t) for t in rng.integers(0, vocab, size=n)]
        if n and rng.random() < 0.1:
            key[int(rng.integers(n))] = odd[int(rng.integers(len(odd)))]
        ranges = store._suffix_ranges(tuple(key))
        assert ranges == store._suffix_ranges_py(tuple(key)), key
        seen_long += bool(ranges) and ranges[0][0] > store.per_word
        for m, lo, hi in ranges[:2]:
            for k in (None, 1, 2, 8, 100):
                assert store._ranked(m, lo, hi, k) == store._ranked_py(m, lo, hi, k), (m, lo, hi, k)
    assert seen_long  # suffixes longer than one packed word were compared (the second word's narrowing)
