"""AFD sizing benchmarks: the paper's check values, simulated optimum vs r*, simulator speed."""

from __future__ import annotations

from moelab.afd import optimal_ratio, simulate, simulated_optimum, sweep
from moelab.afd.sim import R_SWEEP, idle_crossing
from moelab.bench.core import Figure, median_time

# the paper's check values (B, mu_P, mu_D) -> r* at N = 10,000
PAPER_CHECKS = {(256, 100, 500): 9.3, (128, 100, 500): 7.08, (512, 100, 500): 10.3, (256, 100, 100): 2.17,
                (256, 500, 500): 17.25}


def run(quick: bool = False) -> list[Figure]:
    errs = [abs(optimal_ratio(*args, N=10_000) - paper) for args, paper in PAPER_CHECKS.items()]
    figs = [Figure("afd", "afd_rstar_check_max_abs_err", max(errs), "instances", "<= 0.1",
                   "max |r* - paper| over the five check values (N = 10,000)")]
    base = simulated_optimum(256, 100, 500, requests=10_000, seed=0)
    cross = idle_crossing(base.fine)
    figs += [
        Figure("afd", "afd_sim_opt_gap_pct", base.gap_pct, "%", "<= 10",
               f"B=256, mu_P=100, mu_D=500: integer simulated optimum r={base.r_sim} vs r*={base.r_star:.2f}"),
        Figure("afd", "afd_sim_opt_interp_gap_pct", base.interp_gap_pct, "%", "<= 5",
               f"sub-integer (parabolic) simulated optimum {base.r_sim_interp:.2f} vs r*"),
        Figure("afd", "afd_idle_cross_gap_pct", 100 * abs(cross - base.r_star) / base.r_star, "%", "<= 10",
               f"simulated attention/FFN idle curves cross at r={cross:.2f}"),
        Figure("afd", "afd_sim_vs_theory_max_abs_pct", float(base.fine["sim_vs_theory_pct"].abs().max()), "%", "",
               "largest throughput gap theory vs simulation over the swept r (stragglers)"),
    ]
    if not quick:
        gaps, interp = [], []
        for args in PAPER_CHECKS:
            check = simulated_optimum(*args, requests=10_000, seed=0)
            gaps.append((check.gap_pct, args, check.r_sim, check.r_star))
            interp.append((check.interp_gap_pct, args))
        worst = max(gaps)
        figs += [
            Figure("afd", "afd_sim_opt_gap_pct_max_workloads", worst[0], "%", "<= 10",
                   f"worst of the five check workloads: {worst[1]} r_sim={worst[2]} vs r*={worst[3]:.2f} "
                   "(r is an integer: r* between two integers caps how close it can get)"),
            Figure("afd", "afd_sim_opt_interp_gap_pct_max_workloads", max(interp)[0], "%", "<= 10",
                   f"worst sub-integer estimate over the five workloads: {max(interp)[1]}"),
        ]
    t_sim, _ = median_time(lambda: simulate(8, 256, 100, 500, requests=10_000, seed=0), repeat=3 if quick else 5)
    t_sweep, _ = median_time(lambda: sweep(R_SWEEP, 256, 100, 500, requests=10_000, seed=0), repeat=3 if quick else 5)
    figs += [
        Figure("afd", "afd_simulate_seconds", t_sim, "s", "<= 2",
               "simulate(r=8, B=256, N=10,000): 19,570 steps x 3 microbatches"),
        Figure("afd", "afd_sweep_seconds", t_sweep, "s", "<= 5", "sweep over r in {1,2,4,8,16,24,32}, one pipeline pass"),
    ]
    return figs
