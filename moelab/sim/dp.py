"""Discrete-time simulation of ``G`` barrier-synchronised data-parallel decode ranks.

Model (one loop iteration = one decode step):

1. Requests whose (prefill-completed) arrival time has passed become visible.
2. Two kinds of routers, as deployed:

   * **pooled** (BR-0/BR-H, JSQ, least-KV, ...): arrived requests wait in one central FCFS pool; when a
     rank has a free slot the router sees the ``pool_view`` oldest and returns a rank per request
     (``-1`` = keep waiting). This is the paper's setting.
   * **engine queues** (``Router.engine_queues``: vLLM's and SGLang's DP balancers,
     :mod:`moelab.routing.dp_balancers`): every arrived request is dispatched at once to a rank, full or
     not, and waits in *that rank's* FCFS queue; each rank admits from its own queue into free slots.

   Assignments are sticky (no KV migration).
3. Every running request decodes one token. Request ``i`` at its ``j``-th decode step has KV workload
   ``s_i + j - 1``; rank load ``L_g`` is the sum over its running requests; the step lasts
   :meth:`DPCost.step_ms` (barrier: the slowest rank sets the pace; only attention depends on ``L_g``).
4. Requests that produced their ``output_len`` tokens leave, freeing their slots.

When nothing is running or waiting the clock jumps to the next arrival. The result is the one
:class:`moelab.sim.SimResult` (per-request and per-step records, ``metrics(window=...)``); its stated
measurement window skips ``warmup_lifetimes`` request lifetimes (:class:`~moelab.sim.MeasurementWindow`).

Why two loops for one physics: this one advances a single group in lockstep and adds what the DP setting
needs (engine queues, warm-up windows, the router's decision time); :func:`moelab.sim.cluster.simulate` is
event-driven over many decode instances, each optionally a group of ranks admitted by :func:`route_to_ranks`
below and priced by the same folded :meth:`~moelab.costmodel.DecodeStepModel.ep_step_ms`. On one instance they
agree step for step (``tests/test_floor.py::test_one_instance_of_ranks_is_the_dp_simulator``).

Bounded work: the run's step cap is ``max_steps``; a request whose output alone needs more steps is
refused up front, as are slot counts, rank counts and views beyond the stated limits.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import pandas as pd

from moelab._validate import check_instance, check_int
from moelab.costmodel.dp import MAX_SLOTS, MAX_WORKERS, DPCost
from moelab.routing.base import (
    ActiveRequests,
    ClusterView,
    RequestBatch,
    Router,
    RouterCalibration,
    call_router,
    check_supplies,
)
from moelab.sim.result import MeasurementWindow, SimResult
from moelab.traces import RequestTrace

MAX_STEPS = 20_000_000
MAX_POOL_VIEW = 100_000
#: fields of :data:`moelab.routing.FIELDS` this simulator fills for every trace (``prompt_key``,
#: ``signature`` and ``domain`` come from the trace when it has them)
SUPPLIES = ("prompt_len", "output_len", "active", "waiting", "kv_tokens", "free_slots", "time_s",
            "active_requests", "waited_steps")


def route_to_ranks(router: Router, batch: RequestBatch, view: ClusterView, free: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, float]:
    """One admission of a barrier-synchronised DP group: ``router`` places the waiting ``batch`` on the
    group's ranks (``-1`` keeps a request waiting), refused (:class:`~moelab.routing.RouterError` naming the
    router and its answer, before anything is placed) if it raises, answers other than one integer per
    request, names a rank that does not exist or over-fills one past its ``free`` slots. The one rule both
    DP loops admit by (:func:`simulate_dp` and the DP groups of :func:`moelab.sim.cluster.simulate`).

    Returns
    -------
    where : int64 array, the rank of every request of ``batch`` (-1 = waiting)
    chosen : indices of the placed requests
    decision_ms : wall time of the routing call (ms)
    """
    t0 = time.perf_counter()
    # the one driver check: a router that raises, answers the wrong shape, a non-integer, a rank out of
    # range or more requests than a rank has slots is refused (RouterError naming it) before any is placed
    where = call_router(router, batch, view, free_slots=free, unit="rank")
    decision_ms = (time.perf_counter() - t0) * 1e3
    chosen = np.flatnonzero(where >= 0)
    return where, chosen, decision_ms


def simulate_dp(trace: RequestTrace, router: Router, cost: DPCost | None = None, *, n_workers: int, slots: int,
                pool_view: int = 512, warmup_lifetimes: float = 2.0, warmup_frac: float = 0.0,
                max_steps: int = MAX_STEPS, kv_capacity_tokens: float | None = None, seed: int | None = 0) -> SimResult:
    """Run ``trace`` through ``n_workers`` DP ranks of ``slots`` slots each, routed by ``router``.

    The positional order, ``(requests, router, cost)``, is the decode-tier simulators' too
    (:func:`moelab.sim.cluster.simulate`, :func:`moelab.eldr.simulate`); the cluster's size and everything
    else are keywords.

    Parameters
    ----------
    trace : RequestTrace
        The requests: arrival (prefill completed), prompt and output lengths; arrivals at 0 make a backlog.
    router : Router
        Any :class:`moelab.routing.Router`; it is reset for ``n_workers`` with ``seed``. Routers with
        ``engine_queues = True`` get per-rank queues instead of the central pool. One that requires a
        field this simulator does not supply is refused, naming it.
    cost : DPCost, optional
        Step-time model (default :meth:`DPCost.h200` for Qwen3-30B-A3B at ``G``, ``B``); its ``G`` and
        ``B`` must match.
    n_workers, slots : int
        ``1 <= G <= 1024`` ranks with ``1 <= B <= 4096`` batch slots each.
    pool_view : int
        How many of the oldest waiting requests a pooled router sees each step (1..100000).
    warmup_lifetimes : float
        Request lifetimes (mean output length, in steps) left out of the run-level figures while the
        cluster fills up (0..10; at most half the busy steps; the count is in ``metrics()["warmup_steps"]``).
    warmup_frac : float
        Fraction of busy steps left out of the run-level averages (cluster filling up). Both make the
        result's default :class:`~moelab.sim.MeasurementWindow`; ``metrics(window=...)`` re-windows.
    max_steps : int
        The run's step cap (default 20 million). A request whose ``output_len`` exceeds it is refused
        up front; a run that reaches it raises ``RuntimeError``.
    kv_capacity_tokens : float, optional
        KV tokens one rank can hold, given in the router's calibration (:meth:`Router.prepare`) to
        routers that read a KV-cache usage (vLLM >= 0.32); default, for one built without it,
        :meth:`DPCost.kv_capacity_tokens`.

    Returns
    -------
    moelab.sim.SimResult
        ``requests`` (arrival, lengths, ``worker`` = rank, admit / first-token / finish times), ``steps``
        (``t_s``, ``step_ms``, loads, imbalance, counts, router decision time) and ``metrics()`` (the
        run-level figures of the measurement window: imbalance, throughput, TPOT/TTFT/queueing p50-p99,
        decision time).
    """
    G = check_int("G", n_workers, low=1, high=MAX_WORKERS)
    B = check_int("slots", slots, low=1, high=MAX_SLOTS)
    pool_view = check_int("pool_view", pool_view, low=1, high=MAX_POOL_VIEW)
    window = MeasurementWindow(warmup_lifetimes, warmup_frac)  # validates both before the run
    max_steps = check_int("max_steps", max_steps, low=1, high=10 * MAX_STEPS)
    check_instance("trace", trace, RequestTrace, "a RequestTrace")
    check_instance("router", router, Router, "a Router (e.g. make_router('jsq'))")
    if cost is not None:
        check_instance("cost", cost, DPCost, "a DPCost (e.g. DPCost.h200(...)) or None")
    if len(trace) == 0:
        raise ValueError("trace must hold at least one request")
    if not isinstance(router, Router):
        raise ValueError(f"router must be a moelab.routing.Router; got {type(router).__name__}")
    if int(trace.output_len.max()) > max_steps:
        i = int(np.argmax(trace.output_len))
        raise ValueError(f"output_len of request {i} ({int(trace.output_len[i])}) exceeds the run's step cap "
                         f"max_steps={max_steps}; filter the trace (filter_lengths(max_output=...)) or raise max_steps")
    cost = DPCost.h200(G, B) if cost is None else cost
    if not isinstance(cost, DPCost):
        raise ValueError(f"cost must be a DPCost; got {type(cost).__name__}")
    if (cost.n_workers, cost.slots) != (G, B):
        raise ValueError(f"cost was built for G={cost.n_workers}, slots={cost.slots}; simulate got G={G}, slots={B}")
    engine_queues = router.engine_queues
    # the router contract: refuse, naming the field, a router that needs what this trace/driver cannot fill
    supplied = set(SUPPLIES) | {c for c in ("prompt_key", "signature", "domain") if getattr(trace, c, None) is not None}
    if trace.prompt_key is None or np.array_equal(trace.prompt_key, trace.prompt_len):
        supplied.discard("prompt_key")  # Azure: the "key" is the prompt length, not a text hash
    if engine_queues:
        supplied.add("waiting_tokens")  # per-engine queues: the prompt tokens queued at each rank
    check_supplies(router, supplied, f"the BalanceRoute DP simulator on trace {trace.source!r}")
    if router.calibration_needs or kv_capacity_tokens is not None:  # prepare it from what this simulator knows
        if kv_capacity_tokens is None and "kv_capacity_tokens" in router.calibration_needs:
            kv_capacity_tokens = cost.kv_capacity_tokens()
        router.prepare(RouterCalibration(n_workers=G, kv_capacity_tokens=kv_capacity_tokens))
    router.reset(G, seed)
    arrival, P, OUT = trace.arrival_s, trace.prompt_len, trace.output_len
    K = trace.prompt_key if trace.prompt_key is not None else None
    SIG = getattr(trace, "signature", None)
    DOM = getattr(trace, "domain", None)

    def batch_of(ids: np.ndarray) -> RequestBatch:
        return RequestBatch(P[ids], signature=None if SIG is None else SIG[ids], domain=None if DOM is None else DOM[ids],
                            output_len=OUT[ids], request_id=ids, prompt_key=None if K is None else K[ids])
    N = len(trace)
    slot_req = np.full((G, B), -1, np.int64)
    slot_w = np.zeros((G, B), np.int64)   # workload of the coming step (s + generated)
    slot_gen = np.zeros((G, B), np.int64)  # tokens generated so far
    slot_out = np.zeros((G, B), np.int64)  # output length of the request in the slot
    admit = np.full(N, np.nan)
    first = np.full(N, np.nan)
    finish = np.full(N, np.nan)
    rank_of = np.full(N, -1, np.int64)
    seen_step = np.zeros(N, np.int64)  # step a request entered the router's view (starvation guard)
    front = np.zeros(0, np.int64)  # pooled: oldest waiting requests (at most pool_view), FCFS
    queues: list[deque] = [deque() for _ in range(G)]  # engine queues
    queued_tokens = np.zeros(G, np.int64)
    next_fill = 0                  # requests [next_fill, arrived) are waiting behind the front / undispatched
    clock = 0.0
    n_done = 0
    cols: dict[str, list] = {k: [] for k in ("t_s", "step_ms", "max_load", "min_load", "sum_load", "n_active",
                                             "n_waiting", "n_admitted", "n_routed", "decision_ms")}
    step = 0

    def place(wk: np.ndarray, rows: np.ndarray, occ: np.ndarray) -> None:
        order = np.argsort(wk, kind="stable")
        wk, rows = wk[order], rows[order]
        rank = np.arange(wk.size) - np.searchsorted(wk, wk, side="left")
        empty_first = np.argsort(occ, axis=1, kind="stable")  # False (empty) sorts first
        sl = empty_first[wk, rank]
        slot_req[wk, sl] = rows
        slot_w[wk, sl] = P[rows]
        slot_gen[wk, sl] = 0
        slot_out[wk, sl] = OUT[rows]
        admit[rows] = clock

    def view_now(occ: np.ndarray, free: np.ndarray, waiting: np.ndarray, with_active: bool) -> ClusterView:
        loads = slot_w.sum(axis=1)
        active = None
        if with_active:
            og, os_ = np.nonzero(occ)
            ids = slot_req[og, os_]
            active = ActiveRequests(og, slot_w[og, os_], slot_gen[og, os_], P[ids],
                                    None if K is None else K[ids], OUT[ids])
        return ClusterView(occ.sum(axis=1), loads, free, waiting, clock, step=step, active_requests=active,
                           waiting_tokens=queued_tokens.copy() if engine_queues else None)

    while n_done < N:
        if step >= max_steps:
            raise RuntimeError(f"simulation did not finish within max_steps={max_steps}")
        arrived = int(np.searchsorted(arrival, clock, side="right"))
        occ = slot_req >= 0
        n_active_w = occ.sum(axis=1)
        free = B - n_active_w
        n_adm, n_routed, dec_ms = 0, 0, np.nan
        if engine_queues:
            if next_fill < arrived:
                new = np.arange(next_fill, arrived)
                waiting = np.fromiter((len(q) for q in queues), np.int64, G)
                view = view_now(occ, free, waiting, with_active=False)
                batch = batch_of(new)
                t0 = time.perf_counter()
                # engine queues take every request at once: -1 is refused like any other bad answer
                where = call_router(router, batch, view, allow_waiting=False, unit="rank")
                dec_ms = (time.perf_counter() - t0) * 1e3
                for r, g in zip(new.tolist(), where.tolist()):
                    queues[g].append(r)
                np.add.at(queued_tokens, where, P[new])
                rank_of[new] = where
                n_routed = int(new.size)
                next_fill = arrived
            take_w, take_r = [], []
            for g in np.flatnonzero(free > 0).tolist():
                q = queues[g]
                for _ in range(min(int(free[g]), len(q))):
                    take_r.append(q.popleft())
                    take_w.append(g)
            if take_r:
                wk, rows = np.asarray(take_w, np.int64), np.asarray(take_r, np.int64)
                place(wk, rows, occ)
                np.subtract.at(queued_tokens, wk, P[rows])
                n_adm = int(rows.size)
            n_wait = int(sum(len(q) for q in queues))
        else:
            need = pool_view - front.size
            if need > 0 and next_fill < arrived:
                take = min(need, arrived - next_fill)
                new = np.arange(next_fill, next_fill + take)
                seen_step[new] = step
                front = np.concatenate([front, new])
                next_fill += take
            if front.size and free.max() > 0:
                view = view_now(occ, free, None, with_active=True)
                view.waited_steps = step - seen_step[front]
                where, chosen, dec_ms = route_to_ranks(router, batch_of(front), view, free)
                n_routed = int(front.size)
                if chosen.size:
                    wk = where[chosen]
                    rows = front[chosen]
                    place(wk, rows, occ)
                    rank_of[rows] = wk
                    keep = np.ones(front.size, bool)
                    keep[chosen] = False
                    front = front[keep]
                    n_adm = int(chosen.size)
            n_wait = int(front.size + arrived - next_fill)
        occ = slot_req >= 0
        n_active_w = occ.sum(axis=1)
        n_act = int(n_active_w.sum())
        if n_act == 0:
            if n_wait == 0 and arrived < N:  # idle: jump to the next arrival
                clock = max(clock, float(arrival[arrived]))
                continue
            if n_wait > 0:
                raise RuntimeError(f"router {router!r} left {n_wait} requests waiting on an empty cluster")
        loads = slot_w.sum(axis=1)
        dt = cost.step_ms(n_active_w, loads)
        clock += dt / 1e3
        mx = int(loads.max())
        cols["t_s"].append(clock)
        cols["step_ms"].append(dt)
        cols["max_load"].append(mx)
        cols["min_load"].append(int(loads.min()))
        cols["sum_load"].append(int(loads.sum()))
        cols["n_active"].append(n_act)
        cols["n_waiting"].append(n_wait)
        cols["n_admitted"].append(n_adm)
        cols["n_routed"].append(n_routed)
        cols["decision_ms"].append(dec_ms)
        started = occ & (slot_gen == 0)
        if started.any():
            first[slot_req[started]] = clock
        slot_w[occ] += 1
        slot_gen[occ] += 1
        done = occ & (slot_gen >= slot_out)
        if done.any():
            finish[slot_req[done]] = clock
            n_done += int(done.sum())
            slot_req[done] = -1
            slot_w[done] = 0
            slot_gen[done] = 0
        step += 1
    steps = pd.DataFrame(cols)
    steps["imbalance"] = G * steps["max_load"] - steps["sum_load"]
    steps["max_minus_min"] = steps["max_load"] - steps["min_load"]
    steps["idle_fraction"] = np.where(steps["max_load"] > 0,
                                      steps["imbalance"] / (G * steps["max_load"].clip(lower=1)), 0.0)
    name = getattr(router, "name", type(router).__name__)
    requests = pd.DataFrame({"arrival_s": trace.arrival_s, "prompt_len": P, "output_len": OUT, "worker": rank_of,
                             "admit_s": admit, "first_token_s": first, "finish_s": finish})
    return SimResult(requests, steps, name, G, B, 0,
                     {"G": G, "queues": "engine" if engine_queues else "pool", "source": trace.source},
                     window)


__all__ = ["MAX_POOL_VIEW", "MAX_STEPS", "SUPPLIES", "route_to_ranks", "simulate_dp"]
