"""Load-balancing baselines: round-robin, random, JSQ, power-of-two-choices, least-KV, vLLM DP."""

from __future__ import annotations

import numpy as np

from moelab._validate import check_real
from moelab.routing.base import ClusterView, RequestBatch, Router, register_router


@register_router
class RoundRobin(Router):
    """Cycle over workers, skipping those without a free slot."""

    name = "round_robin"
    tags = frozenset({"baseline", "eldr_paper"})

    def reset(self, n_workers: int, seed: int | None = None) -> Router:
        """Forget state; the next request goes to worker 0."""
        super().reset(n_workers, seed)
        self._next = 0
        return self

    def choose(self, batch: RequestBatch, i: int, view: ClusterView, open_: np.ndarray) -> int:
        order = (self._next + np.arange(self.n_workers)) % self.n_workers
        w = int(order[np.argmax(open_[order])])
        self._next = (w + 1) % self.n_workers
        return w


@register_router
class RandomRouter(Router):
    """Uniformly random worker among those with a free slot (seeded)."""

    name = "random"
    tags = frozenset({"baseline", "eldr_paper"})

    def choose(self, batch: RequestBatch, i: int, view: ClusterView, open_: np.ndarray) -> int:
        candidates = np.flatnonzero(open_)
        return int(candidates[self.rng.integers(candidates.size)])


@register_router
class JoinShortestQueue(Router):
    """Fewest in-flight (running + waiting) requests; seeded random tie-break."""

    name = "jsq"
    requires = frozenset({"prompt_len", "free_slots", "active", "waiting"})
    tags = frozenset({"baseline", "eldr_paper"})

    def choose(self, batch: RequestBatch, i: int, view: ClusterView, open_: np.ndarray) -> int:
        return self.argmin_tiebreak(view.active + view.waiting, open_)


@register_router
class PowerOfTwoChoices(Router):
    """Sample two distinct open workers, take the one with fewer in-flight requests."""

    name = "p2c"
    requires = frozenset({"prompt_len", "free_slots", "active", "waiting"})
    tags = frozenset({"baseline", "eldr_paper"})

    def choose(self, batch: RequestBatch, i: int, view: ClusterView, open_: np.ndarray) -> int:
        candidates = np.flatnonzero(open_)
        if candidates.size == 1:
            return int(candidates[0])
        a, b = candidates[self.rng.choice(candidates.size, size=2, replace=False)]
        load = view.active + view.waiting
        return int(a if load[a] <= load[b] else b)


@register_router
class LeastKVTokens(Router):
    """Fewest KV-cache tokens held ("JSQ by KV load"); seeded random tie-break."""

    name = "least_kv"
    requires = frozenset({"prompt_len", "free_slots", "kv_tokens"})
    tags = frozenset({"baseline"})

    def choose(self, batch: RequestBatch, i: int, view: ClusterView, open_: np.ndarray) -> int:
        return self.argmin_tiebreak(view.kv_tokens, open_)


@register_router
class VLLMDataParallel(Router):
    """vLLM's default data-parallel balancing (``DPLBAsyncMPClient``): score ``4*waiting + running``
    from counts the coordinator publishes every ``refresh_s`` seconds; between refreshes the client
    adds its own assignments to the stale snapshot; ties go to the first worker from a start index
    that rotates each call."""

    name = "vllm_dp"
    requires = frozenset({"prompt_len", "free_slots", "active", "waiting", "time_s"})
    tags = frozenset({"baseline"})

    def __init__(self, seed: int | None = 0, refresh_s: float = 0.1, waiting_weight: float = 4.0) -> None:
        super().__init__(seed)
        self.refresh_s = check_real("refresh_s", refresh_s, low=0)
        self.waiting_weight = check_real("waiting_weight", waiting_weight, low=0)

    def reset(self, n_workers: int, seed: int | None = None) -> Router:
        """Forget state: no published snapshot yet, start index 0."""
        super().reset(n_workers, seed)
        self._snapshot_t = -np.inf
        self._waiting = np.zeros(n_workers, np.int64)
        self._running = np.zeros(n_workers, np.int64)
        self._start = 0
        return self

    def route_batch(self, batch: RequestBatch, view: ClusterView) -> np.ndarray:
        if view.time_s - self._snapshot_t >= self.refresh_s:
            self._snapshot_t = view.time_s
            self._waiting = view.waiting.copy()
            self._running = view.active.copy()
        return super().route_batch(batch, view)

    def choose(self, batch: RequestBatch, i: int, view: ClusterView, open_: np.ndarray) -> int:
        score = np.where(open_, self.waiting_weight * self._waiting + self._running, np.inf)
        order = (self._start + np.arange(self.n_workers)) % self.n_workers
        w = int(order[np.argmin(score[order])])
        self._start = (self._start + 1) % self.n_workers
        self._waiting[w] += 1  # the client counts its own request as waiting until the next snapshot
        return w
