"""DSD limits: where edge-cloud speculative decoding pays off, in closed form and simulated."""

from moelab.dsd.montecarlo import MCResult, simulate_rounds
from moelab.dsd.server import capacity_ratio, max_clients, serve
from moelab.dsd.theory import (
    MODES,
    best_mode,
    breakeven_table,
    capacity_gain,
    expected_tokens,
    latency_per_token,
    leviathan_speedup,
    optimal_gamma,
    pipelined_window,
    rtt_breakeven,
)

__all__ = [
    "MODES", "MCResult", "best_mode", "breakeven_table", "capacity_gain", "capacity_ratio", "expected_tokens",
    "latency_per_token", "leviathan_speedup", "max_clients", "optimal_gamma", "pipelined_window", "rtt_breakeven",
    "serve", "simulate_rounds",
]
