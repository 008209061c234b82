"""BalanceRoute benchmarks: dispatch time, simulator speed, imbalance and throughput vs baselines.

Figures (stable names): ``br0_dispatch_ms_p50`` (G=16, 512 waiting: the backlog setting's routing
steps), ``br_sim_seconds`` (10k requests, G=16, BR-0), ``br0_imbalance_reduction_pct`` and
``brh_oracle_imbalance_reduction_pct`` (vs the best baseline; Azure-2023 conversation trace, G=8,
arrival-driven), ``br0_throughput_gain_pct`` (same runs), ``br0_backlog_imbalance_reduction_pct``
(G=16, 72 slots, 80k requests resampled at t=0; vs the best baseline, BF-IO's -83% was vs JSQ).
"""

from __future__ import annotations

import time

import numpy as np

from moelab.balanceroute import experiments as ex
from moelab.balanceroute.cost import StepCost
from moelab.balanceroute.routers import BR0
from moelab.balanceroute.sim import simulate
from moelab.bench.core import Figure

SUITE = "balanceroute"


def run(quick: bool = False) -> list[Figure]:
    trace = ex.load_trace("conv")
    slots = 72
    cost = StepCost.h200(slots)
    figs: list[Figure] = []

    # backlog: G=16, 72 slots, all at t=0; the router sees the 512 oldest waiting requests each step
    n_backlog = 20_000 if quick else 80_000
    backlog = ex.backlog_trace(trace, n_backlog, seed=0)
    df_b, res_b = ex.run_lineup(backlog, ex.lineup(("round_robin", "jsq", "least_kv", "br0"), ex.BRParams()), 16,
                                slots, cost, setting="backlog")
    red_b = ex.reductions(df_b).set_index("router")
    dec = res_b["br0"].steps["decision_ms"].to_numpy()
    dec = dec[np.isfinite(dec)][1:]  # the first call fills an empty cluster (1152 admissions)
    figs.append(Figure(SUITE, "br0_dispatch_ms_p50", float(np.median(dec)), "ms", "<= 1",
                       f"G=16, 72 slots, 512 waiting visible, {dec.size} routing steps; p95 {np.percentile(dec, 95):.2f} ms"))
    figs.append(Figure(SUITE, "br0_backlog_imbalance_reduction_pct", float(red_b.loc["br0", "imbalance_reduction_pct"]),
                       "%", ">= 83",
                       f"vs best baseline {red_b.loc['br0', 'best_baseline_imbalance']}; vs JSQ "
                       f"{red_b.loc['br0', 'imbalance_reduction_vs_jsq_pct']:.1f}% (BF-IO anchor -83% vs JSQ); "
                       f"{n_backlog} requests; throughput {red_b.loc['br0', 'throughput_gain_pct']:+.2f}%"))

    # simulator speed: 10k arrival-driven requests, G=16, BR-0
    tr10k, _ = ex.arrival_trace(trace, 16, slots, cost, n_requests=10_000)
    t0 = time.perf_counter()
    simulate(tr10k, BR0(), 16, slots, cost)
    figs.append(Figure(SUITE, "br_sim_seconds", time.perf_counter() - t0, "s", "<= 10", "10k requests, G=16, BR-0"))

    # arrival-driven, G=8: every router; predictors trained on the first 30% of the trace
    train, sim = ex.split_trace(trace, 0.3)
    params = ex.BRParams()
    names = ex.BASELINES + ("br0", "brh_oracle")
    df, _ = ex.sweep(sim, (8,), slots, names, params, None, n_requests=4000 if quick else None, cost=cost)
    red = ex.reductions(df).set_index("router")
    figs.append(Figure(SUITE, "br0_imbalance_reduction_pct", float(red.loc["br0", "imbalance_reduction_pct"]), "%",
                       ">= 50", f"vs best baseline {red.loc['br0', 'best_baseline_imbalance']} (G=8, arrival-driven, "
                       f"rate x{df['rate_scale'].iloc[0]:.1f}); paper: 48% vs JSQ"))
    figs.append(Figure(SUITE, "brh_oracle_imbalance_reduction_pct",
                       float(red.loc["brh_oracle", "imbalance_reduction_pct"]), "%",
                       f">= {red.loc['br0', 'imbalance_reduction_pct']:.1f}", "must beat BR-0 (goal = BR-0's value)"))
    figs.append(Figure(SUITE, "br0_throughput_gain_pct", float(red.loc["br0", "throughput_gain_pct"]), "%", ">= 0",
                       f"vs best baseline {red.loc['br0', 'best_baseline_throughput']}; TPOT p95 "
                       f"{red.loc['br0', 'tpot_p95_change_pct']:+.2f}%"))
    return figs
