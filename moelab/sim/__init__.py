"""The shared simulation floor, both physics: the decode tier (:func:`simulate`, the whole life of a
decode request, in :mod:`moelab.sim.cluster`) and barrier-synchronised data-parallel ranks
(:func:`simulate_dp`, in :mod:`moelab.sim.dp`); the one result type (:class:`SimResult`, whose
``metrics(window=...)`` takes its :class:`MeasurementWindow`), latency metrics and the one
"gain over the best baseline" helper."""

from moelab.sim.cluster import pack_expert_bits, simulate, supplied_fields
from moelab.sim.dp import simulate_dp
from moelab.sim.metrics import LatencySummary, imbalance, percentiles, summarize_requests
from moelab.sim.result import MeasurementWindow, SimResult, gain_vs_best, gains_table

__all__ = ["LatencySummary", "MeasurementWindow", "SimResult", "gain_vs_best", "gains_table", "imbalance",
           "pack_expert_bits", "percentiles", "simulate", "simulate_dp", "summarize_requests", "supplied_fields"]
