"""BalanceRoute's F-score, its maximiser, projected loads and exact cardinality-bounded subset sums.

For a worker ``g`` with projected margins ``m_{g,h} = M_h - L_g(k+h)`` (h = 0..H) and discounts
``d_h = gamma**h``, a set ``Q`` of waiting requests with total prompt ``Ds`` scores

``F_g(Q) = a * (sum_h d_h) * Ds - b * sum_h d_h * max(Ds - m_{g,h}, 0)``.

``F`` is concave and piecewise linear in ``Ds`` (breakpoints at the margins), so among the subset sums
a worker can reach, the best is one of the two reachable sums around the unconstrained maximiser.
With ``H = 0``, ``a = 1``, ``b = G`` it is BR-0's ``Ds - G*(Ds - m_g)_+``.
"""

from __future__ import annotations

import numpy as np


def discounts(horizon: int, gamma: float) -> np.ndarray:
    """``(1, gamma, gamma**2, ..., gamma**H)``."""
    return gamma ** np.arange(horizon + 1, dtype=np.float64)


def f_score(ds: np.ndarray | float, margins: np.ndarray, d: np.ndarray, a: float, b: float) -> np.ndarray:
    """F for one worker and one or many totals ``ds`` (vectorised over ``ds``)."""
    ds = np.asarray(ds, dtype=np.float64)
    over = np.maximum(ds[..., None] - margins, 0.0)
    return a * d.sum() * ds - b * (over @ d)


def f_argmax(margins: np.ndarray, d: np.ndarray, a: float, b: float) -> float:
    """The ``Ds >= 0`` maximising F (concave): the first margin after which the slope is <= 0."""
    order = np.argsort(margins, kind="stable")
    slope_after = a * d.sum() - b * np.cumsum(d[order])
    past = np.flatnonzero(slope_after <= 0)
    if past.size == 0:  # a > b: F grows without bound, fill as much as possible
        return float("inf")
    return max(0.0, float(margins[order[past[0]]]))


def projected_loads(n_workers: int, horizon: int, worker: np.ndarray, workload: np.ndarray,
                    remaining: np.ndarray) -> np.ndarray:
    """``L[g, h] = sum over active i on g with h < remaining_i of (workload_i + h)``, h = 0..H.

    ``workload`` is each request's KV load at the coming step (prompt + tokens generated so far);
    ``remaining`` the (predicted) number of steps it stays, ceiled; built with difference arrays so the
    cost is O(active + G*H).
    """
    width = horizon + 1
    end = np.clip(np.ceil(remaining).astype(np.int64), 0, width)
    flat = worker * (width + 1) + end
    size = n_workers * (width + 1)
    start_count = np.bincount(worker, minlength=n_workers).astype(np.float64)
    start_sum = np.bincount(worker, weights=workload, minlength=n_workers)
    stop_count = np.bincount(flat, minlength=size).reshape(n_workers, width + 1)[:, :width]
    stop_sum = np.bincount(flat, weights=workload, minlength=size).reshape(n_workers, width + 1)[:, :width]
    # requests leaving at h (end == h) stop counting from h on
    count = start_count[:, None] - np.cumsum(stop_count, axis=1)
    total = start_sum[:, None] - np.cumsum(stop_sum, axis=1)
    return total + count * np.arange(width)[None, :]


def best_subset(sizes: np.ndarray, max_count: int, target: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact cardinality-bounded subset sums around ``target``.

    Returns ``(below, above)``: index arrays (into ``sizes``) of a subset with at most ``max_count``
    items whose sum is the largest reachable sum ``<= target`` (possibly empty) and of one whose sum is
    the smallest reachable sum ``> target`` (empty if none). Among subsets with the same sum the one
    with the most items is returned (keeps batch slots busy). Uses Python integers as bitsets: bit
    ``t`` of ``reach[c]`` says whether ``c`` items can sum to ``t``.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    n = sizes.size
    k = min(max_count, n)
    empty = np.zeros(0, np.int64)
    if n == 0 or k == 0:
        return empty, empty
    order = np.argsort(sizes, kind="stable")
    tgt = int(np.floor(target)) if np.isfinite(target) else int(sizes.sum())
    largest = order[::-1][:k]
    if sizes[largest].sum() <= tgt:  # everything fits: the k largest is the best below, nothing above
        return np.sort(largest), empty
    if sizes[order[0]] > tgt:  # nothing fits: best below is empty, smallest above is the smallest item
        return empty, order[:1]
    if k == 1:
        fits = sizes <= tgt
        below = np.flatnonzero(fits)[np.argmax(sizes[fits])]
        above = np.flatnonzero(~fits)
        return np.array([below]), (above[np.argmin(sizes[above])][None] if above.size else empty)
    # Exact pruning before the bitset search: an item larger than tgt can only appear in an "above"
    # subset, and the single smallest such item beats every subset containing one; among equal sizes
    # at most k copies can be used.
    fits = np.flatnonzero(sizes <= tgt)
    fits = fits[np.argsort(sizes[fits], kind="stable")]
    fs = sizes[fits]
    first_of_size = np.searchsorted(fs, fs, side="left")
    fits = np.sort(fits[np.arange(fs.size) - first_of_size < k])
    over = np.flatnonzero(sizes > tgt)
    keep = np.concatenate([fits, over[[int(np.argmin(sizes[over]))]]]) if over.size else fits
    if keep.size < n:
        below, above = best_subset(sizes[keep], k, tgt)
        return keep[below], keep[above]
    limit = tgt + int(sizes.max())  # the smallest sum above tgt is at most tgt + max size
    mask = (1 << (limit + 1)) - 1
    reach = [1] + [0] * k
    history = []
    for i, s in enumerate(sizes.tolist()):
        history.append(reach[:])
        for c in range(min(k, i + 1), 0, -1):
            reach[c] |= (reach[c - 1] << s) & mask
    union = 0
    for c in range(1, k + 1):
        union |= reach[c]
    low = union & ((1 << (tgt + 1)) - 1)
    below_sum = low.bit_length() - 1 if low else -1
    high = union >> (tgt + 1)
    above_sum = tgt + 1 + ((high & -high).bit_length() - 1) if high else -1

    def rebuild(total: int) -> np.ndarray:
        if total <= 0:
            return empty
        c = max(c for c in range(1, k + 1) if (reach[c] >> total) & 1)
        chosen = []
        for i in range(n - 1, -1, -1):
            if c == 0:
                break
            if (history[i][c] >> total) & 1:  # reachable without item i
                continue
            chosen.append(i)
            total -= int(sizes[i])
            c -= 1
        return np.array(sorted(chosen), dtype=np.int64)

    return rebuild(below_sum), (rebuild(above_sum) if above_sum >= 0 else empty)
