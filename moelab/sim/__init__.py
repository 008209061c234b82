"""The shared decode-cluster floor: the simulator of the decode tier (:func:`simulate`, the whole
life of a decode request), the one result type (:class:`SimResult`), latency metrics and the one
"gain over the best baseline" helper."""

from moelab.sim.metrics import LatencySummary, imbalance, percentiles, summarize_requests
from moelab.sim.result import SimResult, gain_vs_best, gains_table

__all__ = ["LatencySummary", "SimResult", "gain_vs_best", "gains_table", "imbalance", "percentiles",
           "simulate", "summarize_requests"]


def __getattr__(name: str):
    # the simulator imports the expert-trace module; loaded on first use so `moelab.sim` stays light
    if name == "simulate":
        from moelab.sim.cluster import simulate

        return simulate
    raise AttributeError(f"module 'moelab.sim' has no attribute {name!r}")
