"""AFD sizing: the optimal Attention/FFN ratio of an rA-1F bundle, in closed form and simulated."""

from moelab.afd.sim import AFDSimResult, idle_crossing, simulate, simulated_optimum, sweep
from moelab.afd.theory import (
    AFDCoefficients,
    expected_decode_load,
    idle_ratios,
    mean_token_load,
    optimal_ratio,
    ratio_table,
    ratio_terms,
    stage_times,
    throughput_per_instance,
)

__all__ = [
    "AFDSimResult", "idle_crossing", "simulate", "simulated_optimum", "sweep",
    "AFDCoefficients", "expected_decode_load", "idle_ratios", "mean_token_load", "optimal_ratio",
    "ratio_table", "ratio_terms", "stage_times", "throughput_per_instance",
]
