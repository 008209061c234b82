"""Discrete-time simulation of ``G`` barrier-synchronised data-parallel decode workers.

Model (one loop iteration = one decode step):

1. Requests whose (prefill-completed) arrival time has passed join the central waiting pool (FCFS).
2. If any worker has a free slot, the router sees the ``pool_view`` oldest waiting requests and the
   cluster state and returns a worker per request (``-1`` = keep waiting). Assignments are sticky.
3. Every active request decodes one token. Request ``i`` at its ``j``-th decode step has KV workload
   ``s_i + j - 1``; worker load ``L_g`` is the sum over its active requests; the step lasts
   ``StepCost.step_ms(max_g L_g)`` (barrier: the most loaded worker sets the pace).
4. Requests that produced their ``output_len`` tokens leave, freeing their slots.

When nothing is active or waiting the clock jumps to the next arrival. Per step the simulator
records time, step length, ``max``/``min``/``sum`` of loads, imbalance ``G*max - sum``, ``max - min``,
barrier idle fraction ``(G*max - sum) / (G*max)``, active / waiting / admitted counts and the wall time
of the routing call; per request, admission, first-token and finish times. Run-level figures
(:attr:`SimResult.summary`) add output throughput, TPOT p50/p95 and queueing delay.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from moelab._validate import check_int, check_real
from moelab.balanceroute.cost import StepCost
from moelab.routing.base import ClusterView, RequestBatch, Router
from moelab.sim.metrics import percentiles, summarize_requests
from moelab.traces import RequestTrace


@dataclass
class SimResult:
    """Per-step arrays (``steps``), per-request times and run-level ``summary``."""

    router: str
    n_workers: int
    slots: int
    steps: pd.DataFrame
    admit_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    trace: RequestTrace
    summary: dict[str, Any] = field(default_factory=dict)


def _summarise(res: SimResult, warmup_frac: float) -> dict[str, Any]:
    st = res.steps
    # Measurement window: busy steps after a warm-up fraction (an empty cluster filling up) and up to
    # the last admission (the drain tail has no routing decisions left and only lowers occupancy).
    last_adm = np.flatnonzero(st["n_admitted"].to_numpy() > 0)
    end = int(last_adm[-1]) + 1 if last_adm.size else len(st)
    busy = st.iloc[:end]
    busy = busy[busy["n_active"] > 0]
    busy = busy.iloc[int(len(busy) * warmup_frac):]
    G = res.n_workers
    imb = G * busy["max_load"] - busy["sum_load"]
    idle = np.where(busy["max_load"] > 0, 1 - busy["sum_load"] / (G * busy["max_load"].clip(lower=1)), 0.0)
    dur = busy["step_ms"].to_numpy()
    lat = summarize_requests(res.trace.arrival_s, res.first_token_s, res.finish_s, res.trace.output_len)
    queue = res.admit_s - res.trace.arrival_s
    dec = st["decision_ms"].to_numpy()
    dec = dec[np.isfinite(dec)]
    tokens = float(busy["n_active"].sum())
    q = percentiles(queue, (50, 95))
    dq = percentiles(dec, (50, 95, 99))
    return {
        "router": res.router, "G": G, "slots": res.slots, "n_requests": len(res.trace), "n_steps": int(len(st)),
        "avg_imbalance": float(imb.mean()) if len(busy) else float("nan"),
        "avg_max_minus_min": float((busy["max_load"] - busy["min_load"]).mean()) if len(busy) else float("nan"),
        "idle_fraction": float(np.average(idle, weights=dur)) if len(busy) else float("nan"),
        # tokens per second over the measured (post warm-up) busy steps, and over the whole run
        "throughput_tok_s": tokens / (dur.sum() / 1e3) if dur.sum() > 0 else float("nan"),
        "throughput_run_tok_s": lat.throughput_tok_s,
        "makespan_s": lat.makespan_s,
        "mean_step_ms": float(dur.mean()) if dur.size else float("nan"),
        "tpot_ms_p50": lat.tpot_ms_p50, "tpot_ms_p95": lat.tpot_ms_p95,
        "ttft_ms_p50": lat.ttft_ms_p50,
        "queue_s_mean": float(queue.mean()), "queue_s_p50": q["p50"], "queue_s_p95": q["p95"],
        "decision_ms_p50": dq["p50"], "decision_ms_p95": dq["p95"], "decision_ms_p99": dq["p99"],
        "mean_active": float(busy["n_active"].mean()) if len(busy) else 0.0,
        "dropped": dict(res.trace.dropped),
    }


def simulate(trace: RequestTrace, router: Router, n_workers: int, slots: int, cost: StepCost | None = None, *,
             pool_view: int = 512, warmup_frac: float = 0.05, max_steps: int | None = None,
             seed: int | None = 0) -> SimResult:
    """Run ``trace`` through ``n_workers`` DP workers of ``slots`` slots each, routed by ``router``.

    Parameters
    ----------
    trace : RequestTrace
        Arrival (prefill completed), prompt and output lengths; arrivals at 0 make a backlog.
    router : Router
        Any :class:`moelab.routing.Router`; it is reset for ``n_workers`` with ``seed``.
    n_workers, slots : int
        ``G >= 1`` workers with ``B >= 1`` batch slots each.
    cost : StepCost, optional
        Step-time model (default :meth:`StepCost.h200` for ``slots``).
    pool_view : int
        How many of the oldest waiting requests the router sees each step.
    warmup_frac : float
        Fraction of busy steps left out of the run-level averages (cluster filling up).
    max_steps : int, optional
        Safety cap on simulated steps (a ``RuntimeError`` if hit).
    """
    G = check_int("G", n_workers, low=1)
    B = check_int("slots", slots, low=1)
    pool_view = check_int("pool_view", pool_view, low=1)
    warmup_frac = check_real("warmup_frac", warmup_frac, low=0, high=1, high_open=True)
    if not isinstance(trace, RequestTrace):
        raise ValueError(f"trace must be a RequestTrace; got {type(trace).__name__}")
    if len(trace) == 0:
        raise ValueError("trace must hold at least one request")
    if cost is None:
        cost = StepCost.h200(B)
    router.reset(G, seed)
    arrival, P, OUT = trace.arrival_s, trace.prompt_len, trace.output_len
    K = trace.prompt_key if trace.prompt_key is not None else P
    N = len(trace)
    if max_steps is None:
        max_steps = int(OUT.sum()) + N + 10  # even one request per step finishes within this
    slot_req = np.full((G, B), -1, np.int64)
    slot_w = np.zeros((G, B), np.int64)   # workload of the coming step (s + generated)
    slot_gen = np.zeros((G, B), np.int64)  # tokens generated so far
    admit = np.full(N, np.nan)
    first = np.full(N, np.nan)
    finish = np.full(N, np.nan)
    seen_step = np.zeros(N, np.int64)  # step a request entered the router's view (starvation guard)
    front = np.zeros(0, np.int64)  # oldest waiting requests (at most pool_view), FCFS
    next_fill = 0                  # requests [next_fill, arrived) are waiting behind the front
    arrived = 0
    clock = 0.0
    n_done = 0
    cols: dict[str, list] = {k: [] for k in ("time_s", "step_ms", "max_load", "min_load", "sum_load", "n_active",
                                             "n_waiting", "n_admitted", "decision_ms")}
    step = 0
    while n_done < N:
        if step >= max_steps:
            raise RuntimeError(f"simulation did not finish within max_steps={max_steps}")
        arrived = int(np.searchsorted(arrival, clock, side="right"))
        need = pool_view - front.size
        if need > 0 and next_fill < arrived:
            take = min(need, arrived - next_fill)
            new = np.arange(next_fill, next_fill + take)
            seen_step[new] = step
            front = np.concatenate([front, new])
            next_fill += take
        occ = slot_req >= 0
        n_active_w = occ.sum(axis=1)
        free = B - n_active_w
        n_adm, dec_ms = 0, np.nan
        if front.size and free.max() > 0:
            og, os_ = np.nonzero(occ)
            ids = slot_req[og, os_]
            view = ClusterView(n_active_w, slot_w.sum(axis=1), free, None, clock, {
                "step": step,
                "waited_steps": step - seen_step[front],
                "active": {"worker": og, "workload": slot_w[og, os_], "age": slot_gen[og, os_], "prompt_len": P[ids],
                           "prompt_key": K[ids], "output_len": OUT[ids]},
            })
            batch = RequestBatch(P[front], output_len=OUT[front], request_id=front, prompt_key=K[front])
            t0 = time.perf_counter()
            where = np.asarray(router.route(batch, view), dtype=np.int64)
            dec_ms = (time.perf_counter() - t0) * 1e3
            if where.shape != (front.size,) or where.min(initial=0) < -1 or where.max(initial=-1) >= G:
                raise ValueError(f"router {router!r} returned invalid worker ids (shape {where.shape})")
            chosen = np.flatnonzero(where >= 0)
            if chosen.size:
                wk = where[chosen]
                per = np.bincount(wk, minlength=G)
                if np.any(per > free):
                    raise ValueError(f"router {router!r} over-filled a worker: {per.tolist()} vs free {free.tolist()}")
                order = np.argsort(wk, kind="stable")
                wk, rows = wk[order], front[chosen[order]]
                rank = np.arange(wk.size) - np.searchsorted(wk, wk, side="left")
                empty_first = np.argsort(occ, axis=1, kind="stable")  # False (empty) sorts first
                sl = empty_first[wk, rank]
                slot_req[wk, sl] = rows
                slot_w[wk, sl] = P[rows]
                slot_gen[wk, sl] = 0
                admit[rows] = clock
                keep = np.ones(front.size, bool)
                keep[chosen] = False
                front = front[keep]
                n_adm = int(chosen.size)
                occ = slot_req >= 0
                n_active_w = occ.sum(axis=1)
        n_act = int(n_active_w.sum())
        n_wait = int(front.size + arrived - next_fill)
        if n_act == 0:
            if n_wait == 0 and arrived < N:  # idle: jump to the next arrival
                clock = max(clock, float(arrival[arrived]))
                continue
            if n_wait > 0:
                raise RuntimeError(f"router {router!r} left {n_wait} requests waiting on an empty cluster")
        loads = slot_w.sum(axis=1)
        mx = int(loads.max())
        dt = cost.step_ms_scalar(mx)
        clock += dt / 1e3
        cols["time_s"].append(clock)
        cols["step_ms"].append(dt)
        cols["max_load"].append(mx)
        cols["min_load"].append(int(loads.min()))
        cols["sum_load"].append(int(loads.sum()))
        cols["n_active"].append(n_act)
        cols["n_waiting"].append(n_wait)
        cols["n_admitted"].append(n_adm)
        cols["decision_ms"].append(dec_ms)
        started = occ & (slot_gen == 0)
        if started.any():
            first[slot_req[started]] = clock
        slot_w[occ] += 1
        slot_gen[occ] += 1
        done = occ & (slot_gen >= OUT[np.where(occ, slot_req, 0)])
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
    res = SimResult(getattr(router, "name", type(router).__name__), G, B, steps, admit, first, finish, trace)
    res.summary = _summarise(res, warmup_frac)
    return res
