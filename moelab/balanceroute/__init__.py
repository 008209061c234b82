"""BalanceRoute: online data-parallel load balancing for LLM decode (BR-0, BR-H) and its DP simulator.

Modules: ``cost`` (step time vs the most loaded worker's KV load, from the H200 tables), ``sim``
(barrier-synchronised DP decode workers), ``score`` (F-score, projections, exact subset sums),
``routers`` (BR0, BRH), ``predictors`` (oracle, Survival, ExactMatch, learned), ``experiments``
(arrival-driven and backlog settings, sweeps, the paper table).
"""

from moelab.balanceroute.cost import StepCost
from moelab.balanceroute.predictors import (
    ExactMatchPredictor,
    LearnedPredictor,
    OraclePredictor,
    SurvivalPredictor,
    make_predictor,
)
from moelab.balanceroute.routers import BR0, BRH
from moelab.balanceroute.sim import SimResult, simulate

__all__ = ["BR0", "BRH", "ExactMatchPredictor", "LearnedPredictor", "OraclePredictor", "SimResult", "StepCost",
           "SurvivalPredictor", "make_predictor", "simulate"]
