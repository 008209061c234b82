"""ELDR's locality-band router and the domain-label oracle, on the shared :class:`Router` interface.

ELDR: ``s_j = c_j . v`` for the request's unit signature ``v`` and worker ``j``'s centroid ``c_j``;
band = ``{j : s_j >= max_j s_j - tau}`` (among workers with a free slot); route to the least-loaded
worker in the band (fewest in-flight = running + waiting requests; seeded random tie-break).
``tau = 0`` is pure locality; ``tau >= 2`` puts every worker in the band (cosines lie in [-1, 1]),
i.e. plain JSQ.

Load guards (the rule kept after the low-load study of issue 11), only when ``tau > 0`` (``tau = 0``
stays pure locality):

* **spill** (default 1.0, kept): if the least-loaded worker of the band holds more than
  ``(1 + spill) * m + 1`` in-flight requests, where ``m`` is the least load over all open workers, the
  request goes to the globally least-loaded worker (JSQ). At high load the loads are tens of requests
  and the guard rarely fires (locality wins); at low load a band worker holding two or three more
  requests than an idle one is a large relative imbalance while locality saves little (few tokens
  share few experts anyway). Measured on the synthetic Qwen3-30B-A3B workload (1500 requests per run,
  K=8): p99 TPOT gain at 20 req/s -12.6% without guards, +0.1% with spill=1.0.
* **min_band** (default 1 = off, studied and not kept): a band of fewer than ``min_band`` workers is
  widened to the ``min_band`` most similar ones. The authors' artifact is said to widen a one-worker
  band when tau > 0; its code could not be read from here, so this is our reading of that rule. With
  ``min_band=2`` (and spill 0.25 or 0.5) the low-load tail was fixed too, but at K=8 (one worker per
  domain) the p50 gain at 60 req/s fell from 21% to 8-10%: widening gives away the locality ELDR is for.
"""

from __future__ import annotations

import struct

import numpy as np

from moelab._validate import check_array, check_int, check_real
from moelab.eldr.partition import OnlineRefitter, check_directions, spherical_kmeans
from moelab.routing.base import (
    UNASSIGNED,
    ClusterView,
    RequestBatch,
    Router,
    RouterCalibration,
    register_router,
)

_F32 = struct.Struct("f")  # float32 rounding of a Python float without a numpy scalar (the route's hot path)


@register_router
class ELDRRouter(Router):
    """Locality-band routing over one centroid per decode worker.

    For a request with unit signature ``v``, worker ``j`` scores ``s_j = c_j . v`` (the cosine to its
    centroid ``c_j``); the *band* is ``{j : s_j >= max_i s_i - tau}`` among the workers with a free slot,
    and the request goes to the band worker with the fewest requests in flight ``n_j`` (running + waiting;
    seeded random tie-break). ``tau = 0`` is pure locality; ``tau >= 2`` puts every worker in the band
    (cosines lie in [-1, 1]), i.e. plain join-shortest-queue. Two guards act only when ``tau > 0``:

    - the **spill** guard (``spill``, the sigma of ``notebooks/NOTATION.md``): when the least in-flight
      count in the band exceeds ``(1 + spill) * m + 1``, with ``m = min_i n_i`` the least in-flight count
      over the workers, the band is overruled and the request goes to the least-loaded worker (JSQ). At
      high load counts are tens of requests and the guard rarely fires; at low load a band worker holding
      two or three more requests than an idle one is a large relative imbalance while locality saves
      little. Kept at 1.0: on the synthetic Qwen3-30B-A3B workload (K = 8, 1500 requests per run) the
      p99 TPOT gain at 20 req/s was -12.6% without guards and +0.1% with ``spill=1.0``.
    - **min_band**: a band of fewer than ``min_band`` workers is widened to the ``min_band`` workers most
      similar to the request (capped at K). Default 1, which never widens (off); studied and not kept:
      ``min_band=2`` also fixed the low-load tail, but at K = 8 (one worker per domain) it cut the p50 gain
      at 60 req/s from 21% to 8-10%, since widening gives away the locality ELDR is for.

    Parameters
    ----------
    centroids : ndarray, optional
        ``[K, d]`` centroids (rows normalised here; row j belongs to worker j), or None to fit them in
        :meth:`prepare` (balanced spherical K-means of the calibration's ``signatures`` into its
        ``n_workers``).
    tau : float
        Band width (>= 0), default 0.1.
    seed : int, optional
        Tie-break seed.
    refit : OnlineRefitter, optional
        Refits the centroids on recent signatures while routing.
    min_band : int
        Widen a band of fewer workers to the ``min_band`` most similar ones (>= 1; ``tau > 0`` only);
        default 1: off.
    spill : float, optional
        The spill guard's sigma (>= 0; ``tau > 0`` only), default 1.0; None turns the guard off.
    refit_window_s : float, optional
        The online refitter by its window: :meth:`prepare` builds an :class:`OnlineRefitter` that refits
        every ``refit_window_s`` seconds on that window's signatures (at least 4 per worker); not with
        ``refit``.
    balanced : bool
        Balanced (default) or plain spherical K-means when :meth:`prepare` fits the centroids (and refits).
    """

    name = "eldr"
    requires = frozenset({"prompt_len", "free_slots", "active", "waiting", "signature"})
    tags = frozenset({"locality"})
    calibration_needs = frozenset({"n_workers", "signatures"})

    def __init__(self, centroids: np.ndarray | None = None, tau: float = 0.1, seed: int | None = 0,
                 refit: OnlineRefitter | None = None, min_band: int = 1, spill: float | None = 1.0,
                 refit_window_s: float | None = None, balanced: bool = True) -> None:
        super().__init__(seed)
        if refit is not None and refit_window_s is not None:
            raise ValueError("give refit (an OnlineRefitter) or refit_window_s, not both")
        self.refit_window_s = None if refit_window_s is None else check_real("refit_window_s", refit_window_s, low=0,
                                                                             low_open=True)
        self.balanced = bool(balanced)
        self.tau = check_real("tau", tau, low=0)
        self._tau32 = np.float32(self.tau)
        self.min_band = check_int("min_band", min_band, low=1)
        self.spill = None if spill is None else check_real("spill", spill, low=0)
        self._guard = self.spill is not None and self.tau > 0  # tau = 0 stays pure locality (the ablation)
        self.refit = refit
        self.centroids: np.ndarray | None = None
        if centroids is not None:
            self.set_centroids(centroids)
            if self.refit_window_s is not None:
                self.refit = self._window_refitter()

    def _window_refitter(self) -> OnlineRefitter:
        # at least 4 signatures per worker in the window before a refit (K-means on fewer is noise)
        return OnlineRefitter(self.refit_window_s, self.refit_window_s, min_points=4 * self.centroids.shape[0],
                              balanced=self.balanced, seed=self.seed)

    def set_centroids(self, centroids: np.ndarray) -> ELDRRouter:
        """Set the [K, d] centroids (rows normalised; row j belongs to worker j)."""
        C = check_array("centroids", centroids, ndim=2, dtype=np.float64)
        if C.shape[0] < 1:
            raise ValueError("centroids must have K >= 1 rows (one per worker)")
        check_directions("centroids", C)  # a zero centroid would be normalised to zero and score 0 everywhere
        self.centroids = C / np.maximum(np.linalg.norm(C, axis=1, keepdims=True), 1e-12)
        self._ct = np.ascontiguousarray(self.centroids.T)
        # float32 copy for the one-request fast path: the [K, d] matrix is the memory traffic of a decision
        self._c32 = np.ascontiguousarray(self.centroids, dtype=np.float32)
        self._fast_constants()
        self.calibration_needs = frozenset()
        return self

    def _fast_constants(self) -> None:
        """What the one-request path would otherwise work out per call from fixed parameters."""
        self._dim = int(self.centroids.shape[1])
        # the band is widened only below this size (0: never; tau = 0 stays pure locality)
        self._want = min(self.min_band, int(self.centroids.shape[0])) if self.tau > 0 else 0
        self._tau_f = float(self._tau32)  # a float32 value held as a Python float
        self._spill1 = None if not self._guard else 1.0 + self.spill

    def fit(self, signatures: np.ndarray, n_workers: int, *, balanced: bool = True, seed: int = 0) -> ELDRRouter:
        """Set centroids by (balanced) spherical K-means of calibration ``signatures`` into ``n_workers``."""
        self.balanced = bool(balanced)
        return self.prepare(RouterCalibration(n_workers=n_workers, signatures=signatures, seed=seed))

    def prepare_state(self, calibration: RouterCalibration) -> None:
        """Centroids from the calibration's signatures (its fitted ``centroids`` when the driver has them
        cached; without signatures the constructor's stay), and the online refitter when
        ``refit_window_s`` was given."""
        if calibration.centroids is not None:
            self.set_centroids(calibration.centroids)
        elif calibration.signatures is not None:
            if calibration.n_workers is None:
                raise ValueError("router 'eldr' cannot be prepared: the calibration has signatures but lacks "
                                 "['n_workers'] (the centroid count)")
            if calibration.signatures.shape[0] < calibration.n_workers:
                raise ValueError(f"router 'eldr' cannot be prepared: the calibration holds "
                                 f"{calibration.signatures.shape[0]} signatures, fewer than its n_workers="
                                 f"{calibration.n_workers} (one centroid per worker)")
            km = spherical_kmeans(calibration.signatures, calibration.n_workers, balanced=self.balanced,
                                  seed=calibration.seed, name="signatures")
            self.set_centroids(km.centroids)
        if self.refit_window_s is not None:
            self.refit = self._window_refitter()
        self.reset(self.centroids.shape[0] if calibration.n_workers is None else calibration.n_workers)

    @property
    def dim(self) -> int:
        """Signature dimension the centroids expect."""
        if self.centroids is None:
            raise ValueError("ELDRRouter has no centroids; pass centroids= or call fit(signatures, n_workers)")
        return int(self.centroids.shape[1])

    def reset(self, n_workers: int, seed: int | None = None) -> Router:
        """Forget state; ``n_workers`` must equal the number of centroids."""
        super().reset(n_workers, seed)
        if self.centroids is not None and self.centroids.shape[0] != self.n_workers:
            raise ValueError(f"n_workers must equal the number of centroids ({self.centroids.shape[0]}); got {n_workers}")
        return self

    def route(self, batch: RequestBatch, view: ClusterView) -> np.ndarray:
        """Assign each request of ``batch`` to a worker (``-1``: no worker has a free slot).

        :meth:`Router.route`'s checks (prepared, worker count, required fields present) as O(1) tests,
        then one request without a refitter straight to :meth:`_route_one`, anything else to :meth:`route_batch`."""
        if self.calibration_needs:
            raise self._unprepared()
        if view.active.shape[0] != self.n_workers:
            self._bind(view)
        sig = batch.signature
        if sig is None:
            self._check_present(batch, view)  # raises, naming the missing field
        if sig.shape[0] != 1 or self.refit is not None or self.centroids is None:
            return self.route_batch(batch, view)
        if sig.shape[1] != self._dim:
            raise ValueError(f"signature must have dimension {self._dim} (the centroids'); got {sig.shape[1]}")
        w = self._route_one(sig, view)
        return self._route_batch(sig, view) if w is None else np.array([w], dtype=np.int64)

    def route_batch(self, batch: RequestBatch, view: ClusterView) -> np.ndarray:
        """Refit when a refitter is set, then one request on :meth:`_route_one` (when its band is open),
        else :meth:`_route_batch`."""
        sig = batch.signature
        if self.centroids is None:
            self.dim  # noqa: B018 - raises the "no centroids" error
        if sig.shape[1] != self._ct.shape[0]:
            raise ValueError(f"signature must have dimension {self.dim} (the centroids'); got {sig.shape[1]}")
        if self.refit is not None:
            self.refit.observe(view.time_s, sig)
            new = self.refit.maybe_refit(view.time_s, self.centroids)
            if new is not None:
                self.set_centroids(new)
        if sig.shape[0] == 1:
            w = self._route_one(sig, view)
            if w is not None:
                return np.array([w], dtype=np.int64)
        return self._route_batch(sig, view)

    def _route_one(self, sig: np.ndarray, view: ClusterView) -> int | None:
        """One request's worker, or None when a worker of its band is full (:meth:`_route_batch` then bands
        among the open workers). The common case in an event-driven cluster, so kept lean: a row-major
        float32 [K, d] matrix times a vector streams the centroids once; the band and load logic over K
        workers runs on Python lists (a dozen tiny numpy calls cost more than the product); constants are
        worked out once (:meth:`_fast_constants`). If every worker in the global band has a free slot, the
        band among open workers is the same set, so the decision is final. Same arithmetic and tie-break as
        :meth:`_route_batch`."""
        v = sig[0] if sig.dtype == np.float32 else sig[0].astype(np.float32)
        s = np.dot(self._c32, v)
        sl = s.tolist()
        mx = max(sl)
        try:
            # float32(max - tau) exactly as numpy's float32 subtraction rounds it: the difference of two
            # float32 values rounded to double and then to float32 is the correctly rounded float32 result
            # (double carries more than 2 * 24 + 2 bits), and native "f" packing is a C cast (round to
            # nearest, -inf past the range, as numpy)
            thr = _F32.unpack(_F32.pack(mx - self._tau_f))[0]
        except OverflowError:  # a Python whose struct refuses a value past float32's range: numpy's answer
            thr = float(np.float32(mx) - self._tau32)
        cand = [j for j, x in enumerate(sl) if x >= thr]
        if len(cand) < self._want:
            cand = self._band(s, self._tau32).tolist()
        free = view.free_slots  # indexed per band worker: cheaper than a list of K large ints
        for j in cand:
            if free[j] <= 0:
                return None
        load = (view.active + view.waiting).tolist()
        if len(cand) == 1:  # a one-worker band: only the spill guard can move the request
            j = cand[0]
            if self._spill1 is None:
                return j
            ml = min(load)
            if not load[j] > self._spill1 * ml + 1:
                return j
        else:
            lc = list(map(load.__getitem__, cand))  # C-level: a comprehension costs more on 2-3 workers
            m = min(lc)
            ml = None if self._spill1 is None else min(load)
            if ml is None or not m > self._spill1 * ml + 1:
                if lc.count(m) == 1:  # no tie: the one least-loaded worker, without building the tie list
                    return cand[lc.index(m)]
                best = [j for j, x in zip(cand, lc) if x == m]
                return best[self.rng.integers(len(best))]
        # spilled: the least-loaded open worker (JSQ)
        fl = free.tolist()
        if min(fl) > 0:  # every worker open (the usual case): the least load over all is ml
            if load.count(ml) == 1:
                return load.index(ml)
            best = [j for j, x in enumerate(load) if x == ml]
        else:
            cand = [j for j, f in enumerate(fl) if f > 0]
            lc = list(map(load.__getitem__, cand))
            m = min(lc)
            best = [j for j, x in zip(cand, lc) if x == m]
        return best[0] if len(best) == 1 else best[self.rng.integers(len(best))]

    def _route_batch(self, sig: np.ndarray, view: ClusterView) -> np.ndarray:
        """Vectorised over workers: one matrix product for the batch's similarities, then per request
        a masked band and a masked argmin (no Python loop over workers)."""
        S = sig @ self._ct
        load = view.active + view.waiting
        free = view.free_slots.copy()
        out = np.full(sig.shape[0], UNASSIGNED, dtype=np.int64)
        big = np.iinfo(np.int64).max
        for i in range(sig.shape[0]):
            open_ = free > 0
            if not open_.any():
                break
            s = np.where(open_, S[i], -np.inf)
            band = np.zeros(s.shape[0], dtype=bool)
            band[self._band(s, self.tau, int(open_.sum()))] = True
            lb = np.where(band, load, big)
            if self._guard and lb.min() > (1.0 + self.spill) * np.where(open_, load, big).min() + 1:
                lb = np.where(open_, load, big)
            best = np.flatnonzero(lb == lb.min())
            w = int(best[0]) if best.size == 1 else int(best[self.rng.integers(best.size)])
            out[i] = w
            load[w] += 1
            free[w] -= 1
        return out

    def _band(self, s: np.ndarray, tau: float, n_open: int | None = None) -> np.ndarray:
        """Workers whose similarity is within ``tau`` of the best; widened to the ``min_band`` most
        similar when ``tau > 0`` and the band is smaller (never past the ``n_open`` open workers)."""
        cand = np.flatnonzero(s >= s.max() - tau)
        want = min(self.min_band, s.shape[0] if n_open is None else n_open)
        if tau > 0 and cand.size < want:
            cand = np.argpartition(-s, want - 1)[:want]
        return cand

    def __repr__(self) -> str:
        k = None if self.centroids is None else self.centroids.shape[0]
        return (f"ELDRRouter(K={k}, tau={self.tau}, min_band={self.min_band}, spill={self.spill}, seed={self.seed}, "
                f"refit={self.refit is not None})")


@register_router
class DomainOracleRouter(Router):
    """Route by the ground-truth domain label: workers are split into ``n_domains`` fixed contiguous
    groups (as equal as possible; domain ``d`` -> worker ``d mod K`` alone when there are more domains
    than workers, :meth:`worker_groups`), JSQ inside the group with a seeded random tie-break; a request
    whose group has no free slot goes to the least loaded open worker.

    ``n_domains`` : the number of domains (>= 1), or None to count the distinct labels of the
    calibration's ``domains`` in :meth:`prepare`.
    """

    name = "domain_oracle"
    requires = frozenset({"prompt_len", "free_slots", "active", "waiting", "domain"})
    tags = frozenset({"oracle"})
    calibration_needs = frozenset({"domains"})

    def __init__(self, n_domains: int | None = None, seed: int | None = 0) -> None:
        super().__init__(seed)
        self.n_domains = None
        if n_domains is not None:
            self.n_domains = check_int("n_domains", n_domains, low=1)
            self.calibration_needs = frozenset()

    def prepare_state(self, calibration: RouterCalibration) -> None:
        """Count the distinct domain labels of the calibration (when it has them)."""
        if calibration.domains is not None:
            self.n_domains = check_int("the calibration's distinct domains", np.unique(calibration.domains).size,
                                       low=1)

    @staticmethod
    def worker_groups(n_domains: int, n_workers: int) -> np.ndarray:
        """The fixed domain -> workers map the oracle routes by.

        Parameters
        ----------
        n_domains : int
            Number of domains (>= 1).
        n_workers : int
            Number of decode workers K (>= 1).

        Returns
        -------
        np.ndarray
            Boolean ``(n_domains, n_workers)``: row ``d`` marks domain ``d``'s workers. With at least as many
            workers as domains, the workers are cut into ``n_domains`` contiguous groups as equal as possible (each
            worker serves one domain); with more domains than workers, domain ``d`` goes to worker ``d mod K``
            alone, so every group is one worker shared by several domains.
        """
        n_domains = check_int("n_domains", n_domains, low=1)
        n_workers = check_int("n_workers", n_workers, low=1)
        groups = np.zeros((n_domains, n_workers), dtype=bool)
        if n_domains <= n_workers:
            for d, members in enumerate(np.array_split(np.arange(n_workers), n_domains)):
                groups[d, members] = True
        else:
            groups[np.arange(n_domains), np.arange(n_domains) % n_workers] = True
        return groups

    @staticmethod
    def describe_groups(n_domains: int, n_workers: int) -> str:
        """One sentence saying how :meth:`worker_groups` maps ``n_domains`` domains onto ``n_workers`` workers,
        with the counts it computes (for the notebook's prose).

        Parameters
        ----------
        n_domains : int
            Number of domains (>= 1).
        n_workers : int
            Number of decode workers K (>= 1).

        Returns
        -------
        str
        """
        groups = DomainOracleRouter.worker_groups(n_domains, n_workers)
        per_domain = groups.sum(axis=1)  # workers of each domain
        per_worker = groups.sum(axis=0)  # domains on each worker

        def span(counts: np.ndarray) -> str:
            lo, hi = int(counts.min()), int(counts.max())
            return f"{lo}" if lo == hi else f"{lo} to {hi}"

        head = f"{n_domains} domains on K = {n_workers} workers: "
        if n_domains <= n_workers:
            return head + (f"each domain has its own fixed group of {span(per_domain)} workers, and a request goes "
                           "to the least loaded worker of its domain's group")
        return head + (f"domain d goes to worker d mod {n_workers} alone, so each worker serves "
                       f"{span(per_worker)} domains and the oracle has no worker to choose (it moves a request to "
                       "the least loaded other worker only when its own has no free slot)")

    def reset(self, n_workers: int, seed: int | None = None) -> Router:
        """Forget state and map the domains onto the workers (:meth:`worker_groups`)."""
        super().reset(n_workers, seed)
        self._groups = self.worker_groups(self.n_domains, n_workers)
        return self

    def choose(self, batch: RequestBatch, i: int, view: ClusterView, open_: np.ndarray) -> int:
        d = int(batch.domain[i])
        if not 0 <= d < self.n_domains:
            raise ValueError(f"domain must be an integer code in [0, n_domains={self.n_domains}); got {d}")
        in_group = self._groups[d] & open_
        return self.argmin_tiebreak(view.active + view.waiting, in_group if in_group.any() else open_)


__all__ = ["DomainOracleRouter", "ELDRRouter"]
