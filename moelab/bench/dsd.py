"""DSD benchmarks: break-even table vs the paper, Monte-Carlo vs closed forms, capacity ratio, speed."""

from __future__ import annotations

import math

import numpy as np

from moelab.bench.core import Figure, median_time
from moelab.dsd import MODES, breakeven_table, capacity_ratio, simulate_rounds

# the paper's table (gamma=5, t_a=10 ms): RTT_max in ms; None = blank (DSD never beats cloud AR)
PAPER_TABLE = {
    100: {0.5: 47, 0.7: 144, 0.85: 265, 0.9: 319},
    50: {0.5: None, 0.7: 47, 0.85: 108, 0.9: 134},
    30: {0.5: None, 0.7: 8, 0.85: 45, 0.9: 61},
    20: {0.5: None, 0.7: None, 0.85: 13, 0.9: 24},
}


def run(quick: bool = False) -> list[Figure]:
    table = breakeven_table(alphas=(0.5, 0.7, 0.85, 0.9), t_ars=tuple(PAPER_TABLE), gamma=5, t_a=10.0)
    worst = 0.0
    for t_ar, row in PAPER_TABLE.items():
        for alpha, paper in row.items():
            got = table.loc[t_ar, f"{alpha:g}"]
            if paper is None:
                worst = max(worst, 0.0 if math.isnan(got) else math.inf)
            else:
                worst = max(worst, math.inf if math.isnan(got) else abs(got - paper))
    figs = [Figure("dsd", "dsd_breakeven_table_max_err_ms", worst, "ms", "<= 0",
                   "rounded break-even RTT vs the paper's 16 cells (blanks included)")]

    rounds = 5_000 if quick else 20_000
    zs = []
    for i, (alpha, rtt, jitter) in enumerate([(0.6, 20.0, 0.0), (0.8, 45.0, 0.5), (0.9, 150.0, 0.3), (0.7, 300.0, 0.2)]):
        for mode in MODES:
            res = simulate_rounds(mode, alpha=alpha, gamma=5, t_ar=50, t_d=8, t_a=10, rtt=rtt, rtt_jitter=jitter,
                                  rounds=rounds, seed=i)
            zs.append(abs(res.z))
    figs.append(Figure("dsd", "dsd_mc_max_abs_z", float(np.max(zs)), "sigma", "<= 3.5",
                       f"Monte-Carlo latency/token vs closed form, {len(zs)} (mode, alpha, RTT, jitter) points"))

    cmp = capacity_ratio(alpha=0.8, gamma=5, t_d=10, t_v=50, t_a=10, rtt=60, rtt_jitter=0.3,
                         rounds_per_client=100 if quick else 300, seed=0)
    figs += [
        Figure("dsd", "dsd_capacity_ratio_measured", cmp.measured_ratio, "x", "",
               f"gamma=5, t_d=10, t_v=50 ms: DSD {cmp.dsd.clients_interp:.1f} vs co-located "
               f"{cmp.colocated.clients_interp:.1f} clients; predicted {cmp.predicted_ratio:.2f}x"),
        Figure("dsd", "dsd_capacity_ratio_rel_err_pct", 100 * abs(cmp.measured_ratio / cmp.predicted_ratio - 1), "%",
               "<= 5", "multi-client server simulation vs 1 + gamma*t_d/t_v"),
    ]
    t_mc, _ = median_time(lambda: simulate_rounds("dsd_sync", alpha=0.8, gamma=5, t_a=10, t_v=50, rtt=60,
                                                  rtt_jitter=0.3, rounds=20_000, seed=0), repeat=5)
    t_cap, _ = median_time(lambda: capacity_ratio(alpha=0.8, gamma=5, t_d=10, t_v=50, t_a=10, rtt=60,
                                                  rounds_per_client=100, seed=0), repeat=3)
    figs += [
        Figure("dsd", "dsd_mc_seconds_per_20k_rounds", t_mc, "s", "<= 0.1", "simulate_rounds, 20,000 rounds"),
        Figure("dsd", "dsd_capacity_search_seconds", t_cap, "s", "<= 5",
               "capacity_ratio: client-count search for both modes (event-driven server)"),
    ]
    return figs
