"""Offline partition of signatures into one cluster per decode worker: balanced spherical K-means.

k-means++ seeding on cosine distance, then alternate (a) assignment and (b) centroid = normalised
mean of members. The balanced variant gives every cluster ``ceil(N/K)`` slots and solves the
capacity-constrained assignment exactly with ``scipy.optimize.linear_sum_assignment`` on the
``N x (K*cap)`` cost ``1 - X C^T`` (each cluster's column repeated ``cap`` times) up to
:data:`MAX_EXACT_BALANCED_N` points, and approximately (greedy proposals, at most K vectorised rounds)
beyond, up to :data:`MAX_BALANCED_N`: the exact assignment is cubic in N (6,000 points take minutes); "vanilla"
assigns each point to its nearest centroid. Online, :class:`OnlineRefitter` refits on a sliding window
of recent signatures and re-aligns the new centroids to the workers by Hungarian matching.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from moelab._validate import check_array, check_int, check_real, rng_from


@dataclass(frozen=True)
class KMeansResult:
    """``centroids`` [K, d] (unit rows), ``labels`` [N], iterations run, mean cosine similarity of
    points to their centroid, whether the labels stopped changing, and whether the balanced assignment
    was the exact one (``False`` beyond :data:`MAX_EXACT_BALANCED_N` points: the greedy approximation)."""

    centroids: np.ndarray
    labels: np.ndarray
    n_iter: int
    mean_similarity: float
    converged: bool
    balanced: bool
    exact: bool = True

    @property
    def sizes(self) -> np.ndarray:
        """Members per cluster."""
        return np.bincount(self.labels, minlength=self.centroids.shape[0])


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


#: a row whose norm is below this has no direction: ``_unit`` would leave it (near) zero, a centroid that
#: is equally (dis)similar to every signature
_ZERO_NORM = 1e-12


def check_directions(name: str, rows: np.ndarray, *, what: str = "centroid") -> np.ndarray:
    """``rows`` [K, d] (finite) when no row is all zero, else a ``ValueError`` naming the first zero row.

    A zero centroid scores 0 against every signature, so a locality fit holding one is degenerate (its
    worker's band is decided by the other workers' scores alone); it is refused, never normalised away."""
    norms = np.linalg.norm(rows, axis=-1)
    zero = np.flatnonzero(norms < _ZERO_NORM)
    if zero.size:
        raise ValueError(f"{name} must have no all-zero row (a zero {what} has no direction: every cosine with it "
                         f"is 0); got {zero.size} zero row(s), the first at index {int(zero[0])}")
    return rows


def kmeans_pp(X: np.ndarray, K: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding with cosine distance ``1 - x.c`` (seeded)."""
    n = X.shape[0]
    idx = [int(rng.integers(n))]
    dist = np.maximum(1.0 - X @ X[idx[0]], 0.0)
    for _ in range(1, K):
        total = dist.sum()
        nxt = int(rng.choice(n, p=dist / total)) if total > 0 else int(rng.integers(n))
        idx.append(nxt)
        dist = np.minimum(dist, np.maximum(1.0 - X @ X[nxt], 0.0))
    return X[idx].copy()


#: most points the EXACT balanced assignment takes: its cost matrix is N x (K*ceil(N/K)) ~ N^2 floats and
#: ``linear_sum_assignment`` is cubic in N (2048 points: seconds per iteration; 4096: ~40 s; 6000: minutes).
#: Larger sets take the approximate path (:func:`greedy_balanced_assign`), stated in the result.
MAX_EXACT_BALANCED_N = 2048
#: most points balanced K-means takes at all (approximate path: ~K numpy passes over N x K per iteration)
MAX_BALANCED_N = 200_000
#: most similarity entries N x K of one K-means iteration (float64: 512 MiB), balanced or not
MAX_KMEANS_CELLS = 1 << 26


def greedy_balanced_assign(sim: np.ndarray, cap: int) -> np.ndarray:
    """Approximate capacity-constrained assignment (at most ``cap`` points per cluster) in at most ``K``
    vectorised rounds: every unplaced point proposes to its most similar cluster that still has room and
    each cluster keeps its most similar proposers up to its room. Not optimal (the exact
    :func:`balanced_assign` is); it is what balanced K-means uses beyond :data:`MAX_EXACT_BALANCED_N` points."""
    n, K = sim.shape
    if cap * K < n:
        raise ValueError(f"cap must be >= ceil(N/K)={math.ceil(n / K)}; got {cap}")
    labels = np.full(n, -1, dtype=np.int64)
    room = np.full(K, cap, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        s = np.where(room > 0, sim[todo], -np.inf)
        best = np.argmax(s, axis=1)
        for j in np.unique(best).tolist():
            mine = todo[best == j]
            if mine.size > room[j]:
                mine = mine[np.argsort(-sim[mine, j], kind="stable")[: room[j]]]
            labels[mine] = j
            room[j] -= mine.size
        todo = todo[labels[todo] < 0]
    return labels


def balanced_assign(sim: np.ndarray, cap: int) -> np.ndarray:
    """Optimal assignment maximising total similarity with at most ``cap`` points per cluster
    (at most :data:`MAX_EXACT_BALANCED_N` points: exact is cubic in N)."""
    n, K = sim.shape
    if n > MAX_EXACT_BALANCED_N:
        raise ValueError(f"the exact balanced assignment takes at most MAX_EXACT_BALANCED_N={MAX_EXACT_BALANCED_N} "
                         f"points (its time is cubic in N); got N={n}: use greedy_balanced_assign")
    if cap * K < n:
        raise ValueError(f"cap must be >= ceil(N/K)={math.ceil(n / K)}; got {cap}")
    cost = np.repeat(1.0 - sim, cap, axis=1)  # cluster j owns columns j*cap .. (j+1)*cap-1
    rows, cols = linear_sum_assignment(cost)
    labels = np.empty(n, dtype=np.int64)
    labels[rows] = cols // cap
    return labels


def spherical_kmeans(
    X: np.ndarray,
    K: int,
    *,
    balanced: bool = True,
    max_iter: int = 50,
    seed: int | np.random.Generator | None = 0,
    init: np.ndarray | None = None,
    name: str = "X",
) -> KMeansResult:
    """Spherical K-means on unit rows of ``X`` [N, d]; ``balanced`` caps clusters at ``ceil(N/K)``
    (and takes at most :data:`MAX_BALANCED_N` rows).

    The balanced assignment is exact (Hungarian) up to :data:`MAX_EXACT_BALANCED_N` points and
    approximate beyond (:func:`greedy_balanced_assign`; ``KMeansResult.exact`` says which), so a run
    takes seconds, not hours. ``N x K`` is at most :data:`MAX_KMEANS_CELLS`.

    ``init`` [K, d] replaces k-means++ seeding (used by online refits). ``name`` is what messages call
    ``X`` (a caller's own parameter, e.g. ``"signatures"``).

    A zero row has no direction: at least ``K`` rows must be non-zero (fewer is a ``ValueError``, never a
    fit with zero centroids)."""
    X = _unit(check_array(name, X, ndim=2, dtype=np.float64))
    n = X.shape[0]
    if n == 0 or X.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one signature of dimension >= 1; got shape {X.shape}")
    if balanced and n > MAX_BALANCED_N:
        raise ValueError(f"balanced K-means takes at most MAX_BALANCED_N={MAX_BALANCED_N} signatures (each "
                         f"iteration's assignment grows with N x K); got N={n}: subsample them or use balanced=False")
    K = check_int("K", K, low=1, high=n)
    # a zero signature has no direction: it cannot seed or move a centroid, so K centroids need K non-zero
    # signatures (all-zero signatures used to "fit" K zero centroids that route nothing by locality)
    live = np.linalg.norm(X, axis=1) >= _ZERO_NORM
    n_live = int(live.sum())
    if n_live < K:
        raise ValueError(f"{name} must hold at least K={K} non-zero signatures (a zero signature has no direction, so it "
                         f"cannot place a centroid); got {n_live} non-zero of {n}")
    if n * K > MAX_KMEANS_CELLS:
        raise ValueError(f"K-means holds an N x K similarity matrix of at most MAX_KMEANS_CELLS={MAX_KMEANS_CELLS} "
                         f"entries (512 MiB); got N={n} x K={K} = {n * K}: subsample the signatures or use a smaller K")
    exact = not balanced or n <= MAX_EXACT_BALANCED_N
    assign = balanced_assign if exact else greedy_balanced_assign
    max_iter = check_int("max_iter", max_iter, low=1)
    rng = rng_from(seed)
    if init is None:
        C = kmeans_pp(X, K, rng)  # a zero seed is moved by the first update (empty clusters re-seed on live points)
    else:
        C = _unit(check_directions("init", check_array("init", init, shape=(K, X.shape[1]), dtype=np.float64)))
    cap = math.ceil(n / K)
    labels = np.full(n, -1, dtype=np.int64)
    converged = False
    n_iter = 0
    for _ in range(max_iter):
        n_iter += 1
        sim = X @ C.T
        new = assign(sim, cap) if balanced else np.argmax(sim, axis=1)
        if np.array_equal(new, labels):
            converged = True
            break
        labels = new
        sums = np.zeros_like(C)
        np.add.at(sums, labels, X)
        empty = np.linalg.norm(sums, axis=1) < _ZERO_NORM
        if empty.any():  # no members, or only zero signatures: re-seed with the worst-served non-zero points
            served = np.where(live, sim[np.arange(n), labels], np.inf)
            worst = np.argsort(served, kind="stable")[: int(empty.sum())]
            sums[empty] = X[worst]
        C = _unit(sums)
    check_directions("the fitted centroids", C)  # never expected with K live signatures: a guard, named
    sim = np.einsum("nd,nd->n", X, C[labels])
    return KMeansResult(C, labels, n_iter, float(sim.mean()), converged, balanced, exact)


def align_centroids(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Permute ``new`` centroids so row ``j`` is the one most similar to ``old[j]`` overall
    (Hungarian matching on ``-old @ new.T``): workers keep their locality across refits."""
    old = check_array("old", old, ndim=2, dtype=np.float64)
    new = check_array("new", new, ndim=2, dtype=np.float64)
    if old.shape != new.shape:
        raise ValueError(f"new centroids must have the shape of the old ones {old.shape}; got {new.shape}")
    rows, cols = linear_sum_assignment(-(old @ new.T))
    out = np.empty_like(new)
    out[rows] = new[cols]
    return out


class OnlineRefitter:
    """Refit centroids on the signatures seen in the last ``window_s`` seconds, every ``every_s``.

    :meth:`observe` records signatures; :meth:`maybe_refit` returns re-aligned centroids when a
    refit is due and the window holds at least ``min_points`` signatures (else None)."""

    def __init__(self, window_s: float = 5.0, every_s: float = 5.0, *, min_points: int = 64, balanced: bool = True,
                 max_iter: int = 10, seed: int = 0) -> None:
        self.window_s = check_real("window_s", window_s, low=0, low_open=True)
        self.every_s = check_real("every_s", every_s, low=0, low_open=True)
        self.min_points = check_int("min_points", min_points, low=1)
        self.balanced = balanced
        self.max_iter = check_int("max_iter", max_iter, low=1)
        self.rng = rng_from(seed)
        self._buf: deque[tuple[float, np.ndarray]] = deque()
        self._last = 0.0
        self.n_refits = 0

    def observe(self, time_s: float, signatures: np.ndarray) -> None:
        """Record signatures seen at ``t`` (seconds) in the sliding window."""
        time_s = check_real("time_s", time_s)
        for row in np.atleast_2d(check_array("signatures", signatures, dtype=np.float64)):
            self._buf.append((time_s, row))
        while self._buf and self._buf[0][0] < time_s - self.window_s:
            self._buf.popleft()

    def maybe_refit(self, time_s: float, centroids: np.ndarray) -> np.ndarray | None:
        """New centroids aligned to the workers when a refit is due, else None."""
        time_s = check_real("time_s", time_s)
        centroids = check_array("centroids", centroids, ndim=2, dtype=np.float64)
        K = centroids.shape[0]
        if time_s - self._last < self.every_s or len(self._buf) < max(self.min_points, K):
            return None
        self._last = time_s
        X = np.stack([row for _, row in self._buf])
        res = spherical_kmeans(X, K, balanced=self.balanced, max_iter=self.max_iter, seed=self.rng, init=centroids)
        self.n_refits += 1
        return align_centroids(centroids, res.centroids)


__all__ = ["MAX_BALANCED_N", "MAX_EXACT_BALANCED_N", "MAX_KMEANS_CELLS", "KMeansResult", "OnlineRefitter",
           "align_centroids", "balanced_assign", "check_directions", "greedy_balanced_assign", "kmeans_pp",
           "spherical_kmeans"]
