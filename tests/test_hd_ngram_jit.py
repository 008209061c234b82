"""The n-gram table's compiled lookup (``moelab.hd._ngram_jit``) gives exactly the Python lookup's answer
(``NGramTable._lookup_py``, the dict index walked key length by key length) on random tables, contexts and
sizes, including what a foreign file may hold: repeated key rows, -1 padding inside a row, a continuation
repeated within a row, key lengths missing, ids outside the packing range."""

from __future__ import annotations

import numpy as np
import pytest

from moelab.hd import NGramTable
from moelab.hd.ngram import _ALL, _MAX_ID


def _random_table(rng: np.random.Generator, vocab: int, key_lengths: tuple[int, ...], per_key: int,
                  length: int) -> NGramTable:
    tables = {}
    for m in key_lengths:
        n = int(rng.integers(0, 60))
        keys = rng.integers(0, vocab, size=(n, m)).astype(np.int32)
        if n > 3:
            keys[1] = keys[0]  # a repeated key row: the last one answers (as the dict index keeps it)
        conts = rng.integers(0, vocab, size=(n, per_key, length)).astype(np.int32)
        pad = rng.random((n, per_key, length)) < 0.15
        conts[pad] = -1  # unused slots (first token -1) and padding inside a continuation
        if n and per_key > 1:
            conts[0, 1] = conts[0, 0]  # a continuation repeated within a row
        tables[m] = (keys, conts, np.ones((n, per_key), np.int32))
    return NGramTable(length, tables)


@pytest.mark.parametrize("seed", range(6))
def test_compiled_lookup_is_the_python_lookup(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.choice([3, 5, 40]))
    lengths = tuple(sorted(rng.choice([1, 2, 3], size=int(rng.integers(1, 4)), replace=False).tolist()))
    table = _random_table(rng, vocab, lengths, int(rng.integers(1, 6)), int(rng.integers(1, 5)))
    extra = [-1, _MAX_ID, _MAX_ID + 5, 1 << 70]  # ids no stored key holds
    for _ in range(300):
        n = int(rng.integers(0, 4))
        tail = [int(t) for t in rng.integers(0, vocab, size=n)]
        if n and rng.random() < 0.1:
            tail[int(rng.integers(n))] = extra[int(rng.integers(len(extra)))]
        for k in (1, 2, 3, 7, 20, _ALL):
            assert table._lookup(tuple(tail), k) == table._lookup_py(tuple(tail), k), (tail, k)


def test_public_lookup_answers_unchanged_through_the_memo():
    rng = np.random.default_rng(9)
    table = _random_table(rng, 6, (1, 2, 3), 4, 3)
    reference = _random_table(np.random.default_rng(9), 6, (1, 2, 3), 4, 3)
    reference._lookup = reference._lookup_py  # the same table answering through the Python lookup
    for _ in range(400):
        ctx = [int(t) for t in rng.integers(0, 6, size=int(rng.integers(0, 6)))]
        k = int(rng.integers(-2, 9))
        assert table.lookup(ctx, k) == reference.lookup(ctx, k), (ctx, k)
