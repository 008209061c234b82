"""AFD sizing: the optimal Attention/FFN ratio of an rA-1F bundle, in closed form and simulated.

Two simulators: :mod:`moelab.afd.sim` runs the theory's own linear stage times and geometric lengths (the
paper-coefficient mode, a reproduction of the paper's figures); :mod:`moelab.afd.measured` takes stage
times from measured tables and lengths from real traces, and tests the closed form against them.

To compare the two at one workload, give the simulator the closed form's mean lengths as a
:class:`LengthDistribution` (``LengthDistribution.geometric(mu_P, mu_D)``, or a trace's lengths rescaled with
``LengthDistribution.from_trace(kind, mu_P, mu_D)``); :func:`coefficients_from_tables` fits the same six
coefficients on the same design (:data:`FIT_R_VALUES`) as the simulator does.
"""

from moelab.afd.calibration import (
    FIT_R_VALUES,
    CoefficientFit,
    Coverage,
    LinearStages,
    StageTables,
    coefficients_from_tables,
    fit_coefficients,
)
from moelab.afd.coefficients import AFDCoefficients
from moelab.afd.measured import (
    CHECK_WORKLOADS,
    LengthDistribution,
    MeasuredSweep,
    gap_map,
    measured_optimum,
    simulate_measured,
)
from moelab.afd.sim import (
    AFDSimResult,
    OptimumCheck,
    idle_crossing,
    simulate,
    simulated_optimum,
    straggler_crossing,
    sweep,
)
from moelab.afd.theory import (
    RatioTerms,
    attention_takeover_load,
    expected_decode_load,
    idle_ratios,
    mean_token_load,
    optimal_ratio,
    ratio_summary,
    ratio_table,
    ratio_terms,
    stage_times,
    throughput_per_instance,
)

__all__ = [
    "AFDSimResult", "OptimumCheck", "RatioTerms", "Coverage", "idle_crossing", "simulate", "simulated_optimum", "straggler_crossing", "sweep",
    "AFDCoefficients", "attention_takeover_load", "expected_decode_load", "idle_ratios", "mean_token_load", "optimal_ratio",
    "ratio_summary", "ratio_table", "ratio_terms", "stage_times", "throughput_per_instance",
    "CHECK_WORKLOADS", "FIT_R_VALUES", "CoefficientFit", "LengthDistribution", "LinearStages", "MeasuredSweep", "StageTables",
    "coefficients_from_tables", "fit_coefficients", "gap_map", "measured_optimum", "simulate_measured",
]
