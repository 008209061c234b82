"""The compiled queries of :class:`moelab.hd.suffix.SuffixStore` (L, REST's suffix index): the match ranges
of a context's suffixes and the ranking of one range's continuations.

Why compiled: a memo miss ran about twenty numpy calls (packing, two vectorised ``searchsorted``, per-suffix
second-word narrowing, a gather of sampled continuations, boundary masks, packing, unpacking) and a dict count,
~50 us per lookup, ~190 us with the caches an engine's forward leaves cold; here each is one call.

The same answers as ``SuffixStore._suffix_ranges_py`` and ``SuffixStore._ranked_py`` (``tests/test_hd_suffix_jit.py``
compares them on random corpora): the same binary searches over the same packed keys (first word for every
suffix, the second word inside the first word's range for suffixes longer than one word), and the same
ranking (continuations counted over every occurrence, or ``max_samples`` evenly spaced ones; most frequent
first, ties in the order first seen; a continuation stops at its document's boundary; empty ones dropped).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _lower(a: np.ndarray, lo: int, hi: int, v: np.uint64) -> int:
    """The first index in ``[lo, hi)`` with ``a[i] >= v`` (``hi`` if none): ``searchsorted(side="left")``."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _upper(a: np.ndarray, lo: int, hi: int, v: np.uint64) -> int:
    """The first index in ``[lo, hi)`` with ``a[i] > v`` (``hi`` if none): ``searchsorted(side="right")``."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] <= v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def suffix_ranges(key: np.ndarray, k0: np.ndarray, k1: np.ndarray, bits: int, pw: int) -> np.ndarray:
    """``(m, lo, hi)`` rows for every occurring suffix of ``key`` (ids, -1 for one outside the packed range),
    longest first; ``k0``, ``k1``: the sorted keys' packed words, ``pw`` tokens of ``bits`` bits per word."""
    n = key.size
    top = 1 << bits
    ok = 0
    while ok < n and 0 <= key[n - 1 - ok] < top - 1:
        ok += 1
    out = np.empty((ok, 3), dtype=np.int64)
    got = 0
    ub = np.uint64(bits)
    size = k0.size
    for m in range(1, ok + 1):
        w = min(m, pw)
        val = np.uint64(0)
        for j in range(n - m, n - m + w):
            val = (val << ub) | np.uint64(key[j] + 1)
        shift = np.uint64(bits * (pw - w))
        lo = _lower(k0, 0, size, val << shift)
        hi = _upper(k0, 0, size, ((val + np.uint64(1)) << shift) - np.uint64(1))
        if lo >= hi:
            break
        if m > pw:
            w2 = m - pw
            val = np.uint64(0)
            for j in range(n - m + pw, n):
                val = (val << ub) | np.uint64(key[j] + 1)
            shift = np.uint64(bits * (pw - w2))
            lo, hi = (_lower(k1, lo, hi, val << shift),
                      _upper(k1, lo, hi, ((val + np.uint64(1)) << shift) - np.uint64(1)))
            if lo >= hi:
                break
        out[got, 0] = m
        out[got, 1] = lo
        out[got, 2] = hi
        got += 1
    return out[:got][::-1].copy()


@njit(cache=True)
def ranked(order: np.ndarray, tok1: np.ndarray, m: int, lo: int, hi: int, length: int, max_samples: int,
           k: int) -> np.ndarray:
    """The (at most ``k``) most frequent continuations after the occurrences ``lo:hi`` of an ``m``-token match
    (``tok1``: ids + 1, 0 at a document boundary), as rows ``[n, t_1 .. t_n, padding]`` of ``length + 1``."""
    cnt = hi - lo
    ns = cnt if cnt <= max_samples else max_samples
    rows = np.zeros((ns, length), dtype=np.int64)  # each sample's continuation, 0 from the boundary on
    for s in range(ns):
        i = lo + s if cnt <= max_samples else lo + (s * cnt) // max_samples
        p = order[i] + m
        for j in range(length):
            t = np.int64(tok1[p + j])
            if t == 0:
                break
            rows[s, j] = t
    first = np.empty(ns, dtype=np.int64)  # distinct continuations: the sample that showed each first
    count = np.zeros(ns, dtype=np.int64)
    d = 0
    for s in range(ns):
        found = -1
        for e in range(d):
            f = first[e]
            same = True
            for j in range(length):
                if rows[f, j] != rows[s, j]:
                    same = False
                    break
            if same:
                found = e
                break
        if found < 0:
            first[d] = s
            count[d] = 1
            d += 1
        else:
            count[found] += 1
    # most frequent first, ties in the order first seen (a stable insertion sort, as Python's sorted())
    rank = np.arange(d)
    for a in range(1, d):
        r = rank[a]
        b = a - 1
        while b >= 0 and count[rank[b]] < count[r]:
            rank[b + 1] = rank[b]
            b -= 1
        rank[b + 1] = r
    out = np.zeros((min(d, k), length + 1), dtype=np.int64)
    got = 0
    for a in range(d):
        if got >= k:
            break
        f = first[rank[a]]
        if rows[f, 0] == 0:  # an empty continuation (the match ends its document)
            continue
        n = 0
        while n < length and rows[f, n] != 0:
            out[got, n + 1] = rows[f, n] - 1
            n += 1
        out[got, 0] = n
        got += 1
    return out[:got]
