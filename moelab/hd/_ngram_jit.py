"""The compiled lookup of :class:`moelab.hd.ngram.NGramTable` (a memo miss of ``NGramTable._lookup``).

Why compiled: the Python lookup probes one dict per key length (packed-int keys) and a memo per key row, then
builds the row's continuations from a memoryview: a dozen dicts, lists and tuples per step, each a likely cache
miss once an engine's forward between two steps has evicted them (S is queried on most drafting steps). Here
they are read in one call: a key length's keys are one open-addressing table (an int64 array of key, row
pairs), the continuations one flat array (int32 where the ids fit: half the cache lines per row).

The same answer as ``NGramTable._lookup_py`` for ``k >= 1`` (``tests/test_hd_ngram_jit.py`` compares them on random
tables, contexts and ``k``): key lengths longest first; the first key with continuations gives its first ``k``
(distinct, ``-1`` padding dropped, in rank order), later keys top the answer up with continuations not in it yet.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads packed keys over the slots


@njit(cache=True)
def _slot(key: int, bits: int) -> int:
    return np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(64 - bits))


@njit(cache=True)
def build_table(packed: np.ndarray, bits: int) -> np.ndarray:
    """``2 ** bits`` slots of (key, row) pairs, flat (key -1 = empty), mapping every packed key to its row; a
    key that repeats maps to its last row, as ``dict(zip(packed, range(n)))`` does."""
    size = 1 << bits
    slots = np.full(2 * size, -1, dtype=np.int64)
    mask = size - 1
    for r in range(packed.size):
        key = packed[r]
        s = _slot(key, bits)
        while slots[2 * s] != -1 and slots[2 * s] != key:
            s = (s + 1) & mask
        slots[2 * s] = key
        slots[2 * s + 1] = r
    return slots


@njit(cache=True)
def lookup(tail: np.ndarray, meta: np.ndarray, slots: np.ndarray, conts: np.ndarray, length: int,
           k: int) -> np.ndarray:
    """``NGramTable._lookup(tail, k)`` (``k >= 1``) as rows ``[n, t_1 .. t_n, padding]`` of ``length + 1``
    values, one per continuation. ``tail``: the context's last tokens, -1 for an id outside the packing
    range. ``meta``: five values per key length, longest first: the length, its slot bits, its first slot,
    its first continuation cell and its continuations per key; ``slots``: (key, row) pairs (key -1 = empty);
    ``conts``: every key length's continuations, flat (rows, per key, ``length``). Few arguments: each one
    costs the call's type dispatch time."""
    n = tail.size
    cap = 0
    for i in range(0, meta.size, 5):
        cap += meta[i + 4]
    cap = min(cap, k)
    out = np.empty((cap, length + 1), dtype=np.int64)
    got = 0
    for i in range(0, meta.size, 5):
        m = meta[i]
        if n < m:
            continue
        key = 0
        for j in range(n - m, n):
            t = tail[j]
            if t < 0:
                key = -1
                break
            key = (key << 21) | t
        if key < 0:
            continue
        b = meta[i + 1]
        mask = (1 << b) - 1
        base = meta[i + 2]
        s = _slot(key, b)
        row = -1
        while slots[2 * (base + s)] != -1:
            if slots[2 * (base + s)] == key:
                row = slots[2 * (base + s) + 1]
                break
            s = (s + 1) & mask
        if row < 0:
            continue
        g = meta[i + 4]
        start = meta[i + 3] + row * g * length
        for c in range(g):
            p = start + c * length
            if conts[p] < 0:  # an unused slot
                continue
            w = 0  # this continuation with its -1 padding dropped
            for j in range(length):
                t = conts[p + j]
                if t >= 0:
                    w += 1
                    out[got, w] = t
            dup = False
            for o in range(got):  # distinct: against every earlier one (a row may repeat a continuation)
                if out[o, 0] == w:
                    same = True
                    for j in range(1, w + 1):
                        if out[o, j] != out[got, j]:
                            same = False
                            break
                    if same:
                        dup = True
                        break
            if dup:
                continue
            out[got, 0] = w
            got += 1
            if got >= cap:  # k of them, or every slot of every key length (nothing is left then)
                return out[:got]
    return out[:got]
