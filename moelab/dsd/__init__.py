"""DSD limits: where edge-cloud speculative decoding pays off, in closed form and simulated.

:mod:`moelab.dsd.montecarlo` and :mod:`moelab.dsd.server` simulate the closed forms' own world (i.i.d.
acceptance, constant times, one client per server job). :mod:`moelab.dsd.measured` replays acceptance
recorded on a real target (:mod:`moelab.dsd.acceptance`), measured draft/verify costs and RTT distributions
(:mod:`moelab.dsd.rtt`), pays for pipelined drafts a rejection invalidates, and batches verification across
clients. Nothing here imports torch.
"""

from moelab.dsd.acceptance import (
    AcceptanceTrace,
    GeometricTest,
    SequenceRecord,
    chains_proposer,
    drafter_proposer,
    load_shipped,
    load_traces,
    record_acceptance,
    save_traces,
    wilson_interval,
)
from moelab.dsd.measured import (
    BREAKEVEN_AGREE,
    VERIFY_STEPS_MAX,
    BatchedCapacity,
    BatchedResult,
    MeasuredMC,
    breakeven_agreement,
    breakeven_rtt_sync,
    cached_cpu_verify_cost,
    capacity_batched,
    cpu_costs,
    h200_verify_batch_ms,
    h200_verify_curve,
    iid_rounds,
    monotone_fit,
    pooled_blocks,
    serve_batched,
)
from moelab.dsd.measured import simulate as simulate_measured
from moelab.dsd.montecarlo import FamilyAgreement, MCResult, family_agreement, simulate_rounds
from moelab.dsd.rtt import WAN_SCENARIOS, RTTDistribution, measure_loopback_rtt
from moelab.dsd.server import Capacity, CapacityComparison, ServerResult, capacity_ratio, max_clients, serve
from moelab.dsd.theory import (
    MODES,
    best_mode,
    breakeven_table,
    capacity_gain,
    expected_tokens,
    latency_per_token,
    leviathan_speedup,
    optimal_gamma,
    pipelined_breakeven,
    pipelined_window,
    round_table,
    rtt_breakeven,
)

__all__ = [
    "MODES", "MCResult", "best_mode", "breakeven_table", "capacity_gain", "capacity_ratio", "expected_tokens",
    "latency_per_token", "leviathan_speedup", "max_clients", "optimal_gamma", "pipelined_breakeven", "pipelined_window",
    "round_table", "rtt_breakeven",
    "serve", "simulate_rounds", "FamilyAgreement", "family_agreement",
    "AcceptanceTrace", "BREAKEVEN_AGREE", "GeometricTest", "RTTDistribution", "VERIFY_STEPS_MAX", "WAN_SCENARIOS",
    "breakeven_agreement", "breakeven_rtt_sync", "cached_cpu_verify_cost", "capacity_batched",
    "chains_proposer", "cpu_costs", "drafter_proposer", "h200_verify_batch_ms", "h200_verify_curve", "iid_rounds", "load_shipped", "load_traces",
    "measure_loopback_rtt", "monotone_fit", "pooled_blocks", "record_acceptance", "save_traces", "serve_batched", "simulate_measured",
    "wilson_interval",
    "BatchedCapacity", "BatchedResult", "Capacity", "CapacityComparison", "MeasuredMC", "SequenceRecord", "ServerResult",
]
