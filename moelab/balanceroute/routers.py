"""BR-0 and BR-H: BalanceRoute's two-stage F-score routers behind moelab's one router interface.

Both see the waiting pool as a :class:`~moelab.routing.RequestBatch` (oldest first) and the cluster as
a :class:`~moelab.routing.ClusterView` whose ``kv_tokens`` are the worker loads ``L_g`` of the coming
step. BR-H also reads ``view.active_requests`` (per active request: worker, workload, age, prompt
length/key and — for the oracle only — true output length), which the DP simulator provides.

Algorithm (spec ``balanceroute.md``):

1. Stage 1, while some worker has more than ``stage2_slots`` free slots: take the worker with the
   most free slots (ties: lowest load) and give it the single waiting request with the best F;
   loads and envelopes are updated incrementally.
2. Stage 2: pop workers with free slots, largest margin first; give each the subset of at most its
   free slots, from the ``window`` oldest waiting requests, maximising F (exact: bitset subset sums
   around F's maximiser). If no subset scores > 0, force the single best request (nothing starves
   behind an envelope). Requests that waited ``max_wait_steps`` routing steps are forced first.
"""

from __future__ import annotations

import numpy as np

from moelab._validate import check_int, check_real
from moelab.balanceroute.predictors import PREDICTORS, Predictor
from moelab.balanceroute.score import best_subset, discounts, f_argmax, f_score, projected_loads
from moelab.routing.base import UNASSIGNED, ClusterView, RequestBatch, Router, register_router


@register_router
class BRH(Router):
    """BalanceRoute with lookahead ``horizon`` H, discount ``gamma``, weights ``alpha`` / ``beta``.

    Parameters
    ----------
    horizon : int
        Lookahead steps ``0 <= H <= 1024`` (0 = BR-0's current-step score). The defaults are the
        paper's reference constants (H=72, gamma=0.86, alpha=1, beta=43; ``data/balanceroute``); a
        tuned variant is chosen on a training split (:func:`moelab.balanceroute.experiments.tune_brh`).
    gamma : float
        Discount in (0, 1].
    alpha, beta : float
        Reward / penalty weights (``beta=None`` means ``G``, BR-0's penalty slope).
    predictor : Predictor or str
        A fitted :class:`~moelab.balanceroute.predictors.Predictor` (or ``"oracle"``).
    window : int
        Waiting requests considered in stage 2's exact subset choice.
    stage2_slots : int
        Stage 1 runs while some worker has more free slots than this.
    max_wait_steps : int
        Routing steps after which a waiting request is admitted regardless of its score.
    """

    name = "brh"
    # the most BR-H reads (an oracle predictor with H > 0); each instance narrows it to its horizon/predictor
    requires = frozenset({"prompt_len", "free_slots", "kv_tokens", "active_requests", "output_len"})

    def __init__(self, horizon: int = 72, gamma: float = 0.86, alpha: float = 1.0, beta: float | None = 43.0,
                 predictor: Predictor | str = "oracle", window: int = 512, stage2_slots: int = 4,
                 max_wait_steps: int = 2000, seed: int | None = 0) -> None:
        super().__init__(seed)
        self.horizon = check_int("horizon", horizon, low=0, high=1024)
        self.gamma = check_real("gamma", gamma, low=0, high=1, low_open=True)
        self.alpha = check_real("alpha", alpha, low=0)
        self.beta = None if beta is None else check_real("beta", beta, low=0)
        self.window = check_int("window", window, low=1, high=100_000)
        self.stage2_slots = check_int("stage2_slots", stage2_slots, low=1)
        self.max_wait_steps = check_int("max_wait_steps", max_wait_steps, low=1)
        if isinstance(predictor, str):
            if predictor != "oracle":
                raise ValueError(f"predictor given by name must be 'oracle' (others need a training trace: build "
                                 f"one with make_predictor); got {predictor!r}; known: {sorted(PREDICTORS)}")
            predictor = PREDICTORS["oracle"]()
        if not isinstance(predictor, Predictor):
            raise ValueError(f"predictor must be a Predictor or 'oracle'; got {type(predictor).__name__}")
        self.predictor = predictor.fit(None, self.horizon) if predictor.name == "oracle" else predictor
        if self.predictor.horizon != self.horizon:
            raise ValueError(f"predictor was fitted for horizon {self.predictor.horizon}, router uses {self.horizon}")
        self.d = discounts(self.horizon, self.gamma)
        need = {"prompt_len", "free_slots", "kv_tokens"} | ({"active_requests"} if self.horizon > 0 else set())
        if self.predictor.name == "oracle" and self.horizon > 0:
            need.add("output_len")
        self.requires = frozenset(need)

    # ------------------------------------------------------------------ projection
    def _loads(self, view: ClusterView) -> np.ndarray:
        """Projected loads ``L[g, h]`` of the active requests (h = 0..H)."""
        g = view.n_workers
        if self.horizon == 0:
            return view.kv_tokens.astype(np.float64)[:, None]
        act = view.active_requests
        if act is None:
            raise ValueError("active_requests is required by BR-H with horizon > 0 (the running requests' "
                             "worker, workload and age; the DP simulator supplies it)")
        if act.worker.size == 0:
            return np.zeros((g, self.horizon + 1))
        c = self.predictor.truncated_remaining(act.prompt_len, act.age, act.prompt_key, act.output_len)
        return projected_loads(g, self.horizon, act.worker, act.workload.astype(np.float64), c)

    # ------------------------------------------------------------------ routing
    def route_batch(self, batch: RequestBatch, view: ClusterView) -> np.ndarray:
        """The whole waiting pool at once (stage 1, then stage 2); :meth:`Router.route` guards the worker count."""
        n = len(batch)
        out = np.full(n, UNASSIGNED, dtype=np.int64)
        free = view.free_slots.astype(np.int64).copy()
        if n == 0 or free.max(initial=0) <= 0:
            return out
        G = self.n_workers
        a, b = self.alpha, (float(G) if self.beta is None else self.beta)
        d = self.d
        loads = self._loads(view)
        envelope = loads.max(axis=0)
        sizes = batch.prompt_len.astype(np.int64)
        open_req = np.ones(n, dtype=bool)

        def assign(rows: np.ndarray, w: int) -> None:
            nonlocal envelope
            out[rows] = w
            open_req[rows] = False
            free[w] -= rows.size
            loads[w] += float(sizes[rows].sum())
            envelope = np.maximum(envelope, loads[w])

        # starvation guard: requests that waited too long go first, to the worker with most room
        waited = view.waited_steps
        if waited is not None:
            for r in np.flatnonzero(np.asarray(waited) >= self.max_wait_steps):
                if free.max() <= 0:
                    return out
                cand = np.flatnonzero(free > 0)
                w = int(cand[np.argmin(loads[cand, 0])])
                assign(np.array([r]), w)

        # stage 1: plenty of free slots -> one request at a time to the emptiest worker
        while open_req.any() and free.max() > self.stage2_slots:
            most = free.max()
            cand = np.flatnonzero(free == most)
            w = int(cand[np.argmin(loads[cand, 0])])
            rows = np.flatnonzero(open_req)
            scores = f_score(sizes[rows], envelope - loads[w], d, a, b)
            assign(rows[[int(np.argmax(scores))]], w)

        # stage 2: scarce slots -> exact subset choice per worker, largest margin first
        for w in np.argsort(loads[:, 0], kind="stable"):
            if not open_req.any():
                break
            if free[w] <= 0:
                continue
            # the same bounded window (oldest first) for every worker: a consistent, FCFS-leaning
            # candidate set keeps poorly fitting requests from piling up at the head of the pool
            rows = np.flatnonzero(open_req)[: self.window]
            margins = envelope - loads[w]
            target = f_argmax(margins, d, a, b)
            below, above = best_subset(sizes[rows], int(free[w]), target)
            options = [o for o in (below, above) if o.size]
            best_rows, best_f = None, 0.0
            for o in options:
                f = float(f_score(float(sizes[rows[o]].sum()), margins, d, a, b))
                if f > best_f:
                    best_rows, best_f = rows[o], f
            if best_rows is None:  # forced admission: the single best request, even if it scores <= 0
                scores = f_score(sizes[rows], margins, d, a, b)
                best_rows = rows[[int(np.argmax(scores))]]
            assign(best_rows, int(w))
        return out

    def __repr__(self) -> str:
        return (f"BRH(H={self.horizon}, gamma={self.gamma:g}, alpha={self.alpha:g}, beta={self.beta}, "
                f"predictor={self.predictor.name}, window={self.window})")


@register_router
class BR0(BRH):
    """BR-0: BalanceRoute without prediction (``H = 0``, ``alpha = 1``, ``beta = G``)."""

    name = "br0"
    requires = frozenset({"prompt_len", "free_slots", "kv_tokens"})

    def __init__(self, window: int = 512, stage2_slots: int = 4, max_wait_steps: int = 2000,
                 seed: int | None = 0) -> None:
        super().__init__(horizon=0, gamma=1.0, alpha=1.0, beta=None, predictor="oracle", window=window,
                         stage2_slots=stage2_slots, max_wait_steps=max_wait_steps, seed=seed)

    def __repr__(self) -> str:
        return f"BR0(window={self.window}, stage2_slots={self.stage2_slots})"
