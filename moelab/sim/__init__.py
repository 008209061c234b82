"""Shared simulation machinery: latency metrics, percentiles and load-imbalance measures that ELDR's
decode cluster and BalanceRoute's DP cluster both report."""

from moelab.sim.metrics import LatencySummary, imbalance, percentiles, summarize_requests

__all__ = ["LatencySummary", "imbalance", "percentiles", "summarize_requests"]
