"""ELDR benchmark: route latency, simulator speed, TPOT gain and distinct-expert reduction at the
documented realistic-scale operating point, and the cost-model fit errors.

Operating point (documented): SYNTHETIC Qwen3-30B-A3B-shaped workload (48 layers x 128 experts,
top-8; ``moelab.eldr.workload``), 16 decode workers, 512 output tokens, Poisson arrivals at
60 req/s (the middle of the paper's 20-100 req/s sweep at 8P16D), H200 cost model. The gain is
ELDR's p50 TPOT against the best of round-robin / random / JSQ / P2C on the same arrivals.
"""

from __future__ import annotations

import os
import time

import numpy as np

from moelab.bench.core import Figure
from moelab.costmodel import DecodeLayerModel, DecodeStepModel, MoEStepModel
from moelab.eldr.experiments import BASELINES, prepare, run_one
from moelab.eldr.routing import ELDRRouter
from moelab.eldr.sim import poisson_requests, simulate
from moelab.eldr.workload import SyntheticConfig, generate
from moelab.routing import ClusterView, RequestBatch
from moelab.sim import gain_vs_best

OPERATING_RATE = 60.0


def _load() -> str:
    """The machine's 1-minute load average: wall-clock figures on a shared machine need it."""
    try:
        return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    except OSError:
        return "load average unknown"


def route_us_p50(centroids: np.ndarray, signatures: np.ndarray, calls: int = 3000, seed: int = 0) -> float:
    """Median wall-clock microseconds of one ELDR route decision (one request, K = len(centroids))."""
    rng = np.random.default_rng(seed)
    n_workers = centroids.shape[0]
    router = ELDRRouter(centroids, tau=0.1).reset(n_workers)
    batches = [RequestBatch(np.array([500]), s[None]) for s in signatures[:256]]
    view = ClusterView(rng.integers(0, 60, n_workers), rng.integers(0, 50000, n_workers), np.full(n_workers, 1 << 30))
    times = np.empty(calls)
    for i in range(calls):
        b = batches[i % len(batches)]
        t0 = time.perf_counter_ns()
        router.route(b, view)
        times[i] = time.perf_counter_ns() - t0
    return float(np.median(times[calls // 10:]) / 1e3)


def run(quick: bool = False) -> list[Figure]:
    """Measure the ELDR figures (``quick``: a smaller trace and fewer requests)."""
    n_trace = 512 if quick else 2048
    n_req = 10_000
    out_len = 512
    wl = generate(n_trace, SyntheticConfig(), seed=0)
    setup = prepare(wl.trace, DecodeStepModel.h200("qwen3-30b-a3b"), 16, n_pairs=10_000 if quick else 30_000,
                    prefix_counts=wl.prefix_counts)
    sig = setup.signatures()
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # one routing thread, as in a serving router; BLAS threads only add overhead
        route_us = route_us_p50(setup.centroids(), sig)
    figs = [Figure("eldr", "eldr_route_us_p50", route_us, "us", "<= 20",
                   f"one request, K=16, count_idf signature of dimension {sig.shape[1]} (fitted on the synthetic "
                   f"Qwen3-30B-A3B-shaped workload: 48 layers x 128 experts before masking), numpy; {_load()}")]
    reqs = poisson_requests(setup.pool, rate=100.0, n_requests=n_req, output_len=out_len, seed=1)
    router = ELDRRouter(setup.centroids(), tau=0.1)
    t0 = time.perf_counter()
    res = simulate(setup.pool, reqs, router, setup.cost, n_workers=16, signatures=sig, bits=setup.bits)
    sim_s = time.perf_counter() - t0
    figs.append(Figure("eldr", "eldr_sim_seconds", sim_s, "s", "<= 10",
                       f"16 workers, {n_req} requests x {out_len} tokens at 100 req/s, ELDR routing, {len(res.steps)} steps "
                       f"(synthetic Qwen3-30B-A3B-shaped traces); {_load()}"))

    n_op = 2000 if quick else 6000
    runs = {r: run_one(setup, r, rate=OPERATING_RATE, n_requests=n_op, output_len=out_len) for r in (*BASELINES, "eldr")}
    gain, best = gain_vs_best(runs, "eldr", BASELINES)
    red = 100 * (1 - runs["eldr"]["distinct_per_layer_step"] / runs[best]["distinct_per_layer_step"])
    note = (f"synthetic Qwen3-30B-A3B-shaped workload, 16 workers, {OPERATING_RATE:g} req/s, {n_op} requests x {out_len} "
            f"tokens; best baseline {best}: {runs[best]['tpot_ms_p50']:.2f} ms vs ELDR {runs['eldr']['tpot_ms_p50']:.2f} ms")
    figs.append(Figure("eldr", "eldr_tpot_gain_pct", gain, "%", ">= 5.9", note))
    figs.append(Figure("eldr", "eldr_distinct_expert_reduction_pct", red, "%", "",
                       f"distinct experts per layer per step: {runs[best]['distinct_per_layer_step']:.1f} ({best}) vs "
                       f"{runs['eldr']['distinct_per_layer_step']:.1f} (ELDR)"))
    moe = MoEStepModel.h200()
    layer = DecodeLayerModel.h200()
    figs.append(Figure("eldr", "costmodel_moe_median_abs_err_pct", moe.report.median_abs_err_pct, "%", "<= 10",
                       f"{len(moe.report.measured)} measured MoE-layer points"))
    figs.append(Figure("eldr", "costmodel_layer_median_abs_err_pct", layer.test_report.median_abs_err_pct, "%", "<= 10",
                       f"{len(layer.test_report.measured)} held-out decode_layer.csv points"))
    return figs
