"""What routing does to a deployment's decode batches, measured on a captured trace.

Given a trace captured from a live deployment (e.g. through vLLM) and per-request routing
signatures, each router places the requests on ``K`` decode workers (equal capacity, arrival order);
each worker then decodes its requests together, and we count the DISTINCT experts each decode step
loads per MoE layer — the quantity MoE decode latency follows (ELDR's premise). Pure numpy on the
trace's recorded expert ids; no model is run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from moelab._validate import check_instance, check_int, rng_from
from moelab.routers import check_supplies, make_router, router_names
from moelab.routing import ClusterView, RequestBatch, Router
from moelab.sim import gain_vs_best
from moelab.traces import ExpertTrace

#: what :func:`assign` can tell a router (requests arrive one by one; nothing finishes meanwhile)
SUPPLIES = frozenset({"prompt_len", "signature", "active", "waiting", "kv_tokens", "free_slots", "time_s"})


def assign(router: Router, signatures: np.ndarray, prompt_lens: np.ndarray, n_workers: int, *,
           order: np.ndarray | None = None) -> np.ndarray:
    """Worker of every request when ``router`` places them one by one on ``n_workers`` workers of
    capacity ``ceil(N / n_workers)`` (nothing finishes meanwhile). ``order``: arrival order."""
    check_instance("router", router, Router, "a Router (e.g. make_router('jsq'))")
    n_workers = check_int("n_workers", n_workers, low=1)
    n = len(prompt_lens)
    order = np.arange(n) if order is None else np.asarray(order)
    if order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError(f"order must be a permutation of range({n}) (each request placed exactly once)")
    check_supplies(router, SUPPLIES, "the trace routing what-if (serving.analysis.assign)", engine_queues=False)
    cap = math.ceil(n / n_workers)
    view = ClusterView(np.zeros(n_workers), np.zeros(n_workers), np.full(n_workers, cap))
    router.reset(n_workers)
    out = np.full(n, -1, dtype=np.int64)
    for i in order:
        w = int(router.route(RequestBatch(prompt_lens[i:i + 1], signature=signatures[i:i + 1]), view)[0])
        out[i] = w
        view.admit(w, int(prompt_lens[i]))
    return out


def distinct_per_step(trace: ExpertTrace, workers: np.ndarray, n_workers: int, *, max_steps: int | None = None) -> float:
    """Mean distinct experts per layer per decode step, over workers and steps, when each worker
    decodes its requests as one batch (step ``t`` of every request together)."""
    shortest = int(trace.decode_lens.min())
    if shortest < 1:
        raise ValueError("every request needs at least one captured decode step")
    if max_steps is not None:
        check_int("max_steps", max_steps, low=1, high=shortest)
    steps = shortest if max_steps is None else int(max_steps)
    vals = [trace.distinct_experts(np.flatnonzero(workers == w), t).mean()
            for w in range(n_workers) if np.any(workers == w) for t in range(steps)]
    return float(np.mean(vals))


def compare_routers(trace: ExpertTrace, signatures: np.ndarray, centroids: np.ndarray, n_workers: int, *,
                    routers: tuple[str, ...] = (*router_names("eldr_paper"), "eldr"), tau: float = 0.1,
                    seed: int = 0) -> dict[str, Any]:
    """Distinct experts per layer per decode step under each router, plus ELDR's reduction vs the
    best load balancer. Requests arrive in a seeded random order (same for every router)."""
    order = rng_from(seed).permutation(trace.n_requests)
    lens = trace.prompt_lens
    out: dict[str, Any] = {"distinct": {}, "groups": {}}
    for name in routers:
        # centroids and tau go to the routers that take them (ELDR)
        router = make_router(name, seed=seed, options={"centroids": centroids, "tau": tau})
        w = assign(router, signatures, lens, n_workers, order=order)
        out["groups"][name] = w
        out["distinct"][name] = distinct_per_step(trace, w, n_workers)
    base = [k for k in out["distinct"] if k != "eldr"]
    if "eldr" in out["distinct"] and base:
        res = {k: {"distinct": v} for k, v in out["distinct"].items()}
        out["eldr_reduction_pct"] = gain_vs_best(res, "eldr", base, metric="distinct")[0]
    return out
