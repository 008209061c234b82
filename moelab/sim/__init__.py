"""The shared decode-cluster floor: the simulator of the decode tier (:func:`simulate`, the whole
life of a decode request, in :mod:`moelab.sim.cluster`), the one result type (:class:`SimResult`),
latency metrics and the one "gain over the best baseline" helper."""

from moelab.sim.cluster import pack_expert_bits, simulate, supplied_fields
from moelab.sim.metrics import LatencySummary, imbalance, percentiles, summarize_requests
from moelab.sim.result import SimResult, gain_vs_best, gains_table

__all__ = ["LatencySummary", "SimResult", "gain_vs_best", "gains_table", "imbalance", "pack_expert_bits", "percentiles",
           "simulate", "summarize_requests", "supplied_fields"]
