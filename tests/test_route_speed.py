"""The ELDR route decision's lean one-request path decides exactly as the path it replaced.

``_reference_route`` is the decision code of ``ELDRRouter._route`` before the one-request path was rewritten
for speed (issue 28: the ``eldr_route_us_p50`` goal), frozen here: same float32 product, same float32 band
threshold, same guards, same seeded tie-break. Every case routes the same requests through a router on the
new path and a same-seeded router on the reference and requires the same worker for every request, in order
(a tie-break that consumed the random stream differently would show up in later decisions).
"""

from __future__ import annotations

import numpy as np
import pytest

from moelab.eldr.routing import ELDRRouter
from moelab.routing import UNASSIGNED, ClusterView, RequestBatch


def _reference_route(r: ELDRRouter, batch: RequestBatch, view: ClusterView) -> np.ndarray:
    """``ELDRRouter._route`` as it was (no refitter), reading the router's fitted state."""
    sig = batch.signature
    if sig.shape[0] == 1:
        v = sig[0] if sig.dtype == np.float32 else sig[0].astype(np.float32)
        s = np.dot(r._c32, v)
        sl = s.tolist()
        thr = float(np.float32(max(sl)) - r._tau32)
        cand = [j for j, v in enumerate(sl) if v >= thr]
        if r.tau > 0 and len(cand) < min(r.min_band, len(sl)):
            cand = r._band(s, r._tau32).tolist()
        free = view.free_slots.tolist()
        if min(free[j] for j in cand) > 0:
            load = (view.active + view.waiting).tolist()
            lc = [load[j] for j in cand]
            m = min(lc)
            if r._guard and m > (1.0 + r.spill) * min(load) + 1:
                cand = [j for j, f in enumerate(free) if f > 0]
                lc = [load[j] for j in cand]
                m = min(lc)
            best = [j for j, x in zip(cand, lc) if x == m]
            w = best[0] if len(best) == 1 else best[r.rng.integers(len(best))]
            return np.array([w], dtype=np.int64)
    S = sig @ r._ct
    load = view.active + view.waiting
    free = view.free_slots.copy()
    out = np.full(len(batch), UNASSIGNED, dtype=np.int64)
    big = np.iinfo(np.int64).max
    for i in range(len(batch)):
        open_ = free > 0
        if not open_.any():
            break
        s = np.where(open_, S[i], -np.inf)
        band = np.zeros(s.shape[0], dtype=bool)
        band[r._band(s, r.tau, int(open_.sum()))] = True
        lb = np.where(band, load, big)
        if r._guard and lb.min() > (1.0 + r.spill) * np.where(open_, load, big).min() + 1:
            lb = np.where(open_, load, big)
        best = np.flatnonzero(lb == lb.min())
        w = int(best[0]) if best.size == 1 else int(best[r.rng.integers(best.size)])
        out[i] = w
        load[w] += 1
        free[w] -= 1
    return out


def _case(rng: np.random.Generator):
    """Centroids, signatures, a cluster view and router options drawn to hit the edges: duplicated and nearly
    equal centroids (ties in similarity), tau set to an exact similarity gap (the float32 threshold's
    rounding), loads with ties and a zero (the spill guard), full workers (the fall back to the batch path)."""
    k = int(rng.integers(1, 21))
    d = int(rng.integers(1, 40))
    C = rng.standard_normal((k, d))
    if k > 1 and rng.random() < 0.5:  # duplicated or nearly equal rows: equal or near-equal similarities
        src = rng.integers(0, k, k // 2 + 1)
        dst = rng.integers(0, k, k // 2 + 1)
        C[dst] = C[src] + (0 if rng.random() < 0.5 else 1e-7) * rng.standard_normal((dst.size, d))
    n = 1 if rng.random() < 0.6 else int(rng.integers(2, 4))  # mostly the one-request path
    sig = rng.standard_normal((6, n, d)) * (10.0 ** rng.integers(-3, 4))
    if rng.random() < 0.3:
        sig[:, :, rng.integers(0, d)] = 0.0
    r_opts = {"tau": float(rng.choice([0.0, 0.01, 0.05, 0.1, 0.3, 1.0, 2.5])),
              "min_band": int(rng.choice([1, 1, 2, 3])), "spill": [None, 0.0, 0.25, 1.0][rng.integers(4)],
              "seed": int(rng.integers(0, 1000))}
    load = rng.integers(0, 4 if rng.random() < 0.5 else 60, k)
    waiting = rng.integers(0, 3, k) * (rng.random() < 0.5)
    if rng.random() < 0.4:  # tau = a similarity gap, a few float32 ulps short: max - tau falls just above a member
        c32 = (C / np.maximum(np.linalg.norm(C, axis=1, keepdims=True), 1e-12)).astype(np.float32)
        s = c32 @ sig[int(rng.integers(0, 6)), 0].astype(np.float32)
        edge = int(rng.integers(0, k))
        t32 = np.float32(float(s.max()) - float(s[edge]))
        for _ in range(int(rng.integers(0, 3))):
            t32 = np.nextafter(t32, np.float32(0))
        r_opts["tau"] = float(t32)
        if rng.random() < 0.7:  # the edge member is the one to pick when it is in the band
            load, waiting = np.ones(k, dtype=np.int64), np.zeros(k, dtype=np.int64)
            load[edge] = 0
    free = np.full(k, int(rng.choice([1, 3, 1 << 30])))
    if rng.random() < 0.4:
        free[rng.permutation(k)[:int(rng.integers(0, k + 1))]] = 0
    return C, sig, ClusterView(load, np.zeros(k), free, waiting), r_opts


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_route_decisions_identical_to_reference(dtype):
    rng = np.random.default_rng(28)
    differ = []
    for case in range(1500):
        C, sig, view, opts = _case(rng)
        new = ELDRRouter(C, **opts).reset(C.shape[0])
        ref = ELDRRouter(C, **opts).reset(C.shape[0])
        for b in sig:
            batch = RequestBatch(np.full(b.shape[0], 7), b.astype(dtype))
            got, want = new.route(batch, view), _reference_route(ref, batch, view)
            if not np.array_equal(got, want):
                differ.append((case, opts, got.tolist(), want.tolist()))
    assert not differ, differ[:3]


def test_route_fast_path_reaches_each_branch():
    """Each branch of the one-request path by hand: a one-worker band kept or spilled, a wider band with
    and without a tie, spilled onto all workers and onto the open ones, a full band worker."""
    K = 4
    C = np.eye(K)
    v_one = np.array([[1.0, 0.0, 0.0, 0.0]], dtype=np.float32)  # band {0} at tau 0.1
    v_two = np.array([[1.0, 1.0, 0.0, 0.0]], dtype=np.float32)  # band {0, 1}

    def route(v, load, free=None, **kw):
        view = ClusterView(np.asarray(load), np.zeros(K), np.full(K, 5) if free is None else np.asarray(free))
        return int(ELDRRouter(C, tau=0.1, **kw).reset(K).route(RequestBatch([1], v), view)[0])

    assert route(v_one, [9, 0, 0, 0], spill=None) == 0  # no guard: locality
    assert route(v_one, [1, 0, 0, 0]) == 0  # within the guard
    assert route(v_one, [9, 3, 0, 2]) == 2  # spilled onto every (open) worker: the least loaded
    assert route(v_one, [9, 3, 0, 0], free=[5, 5, 0, 5]) == 3  # spilled onto the open workers only
    assert route(v_two, [2, 1, 0, 0]) == 1  # a two-worker band: its least loaded
    assert route(v_two, [1, 1, 0, 0]) in (0, 1)  # a tie inside the band, broken at random
    assert route(v_two, [9, 9, 0, 1]) == 2  # a wider band spilled
    assert route(v_two, [0, 5, 5, 5], free=[0, 5, 5, 5]) == 1  # a full band worker: banded among the open ones
    assert route(v_one, [0, 0, 0, 0], free=[0, 0, 0, 0]) == UNASSIGNED


def test_route_checks_stay():
    """The O(1) checks still refuse what :meth:`Router.route` refused."""
    r = ELDRRouter(np.eye(3)).reset(3)
    view = ClusterView(np.zeros(3), np.zeros(3), np.full(3, 2))
    with pytest.raises(ValueError, match="dimension 3"):
        r.route(RequestBatch([1], np.ones((1, 4))), view)
    with pytest.raises(ValueError, match="signature is required"):
        r.route(RequestBatch([1]), view)
    with pytest.raises(ValueError, match="reset for 3"):
        r.route(RequestBatch([1], np.ones((1, 3))), ClusterView(np.zeros(4), np.zeros(4), np.full(4, 2)))
    with pytest.raises(ValueError, match="not prepared"):
        ELDRRouter().route(RequestBatch([1], np.ones((1, 3))), view)
    fresh = ELDRRouter(np.eye(3))  # never reset: adopts the view's worker count on first use
    assert fresh.route(RequestBatch([1], np.eye(3)[1:2]), view).tolist() == [1]


def test_route_threshold_past_float32_range():
    """max - tau below float32's range: numpy's float32 subtraction gives -inf (every worker in the band),
    and so does the lean path's fallback."""
    C = np.eye(3)
    view = ClusterView(np.array([2, 0, 1]), np.zeros(3), np.full(3, 4))
    batch = RequestBatch([1], np.array([[-3.0e38, -3.2e38, -3.3e38]], dtype=np.float32))
    new, ref = ELDRRouter(C, tau=1e38, spill=None), ELDRRouter(C, tau=1e38, spill=None)
    with np.errstate(over="ignore"):
        want = _reference_route(ref.reset(3), batch, view)
    assert new.reset(3).route(batch, view).tolist() == want.tolist() == [1]
