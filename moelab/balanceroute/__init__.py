"""BalanceRoute: online data-parallel load balancing for LLM decode (BR-0, BR-H) and its DP simulator.

Modules: ``cost`` (barrier step time of DP-attention + EP ranks, folded from the floor's
:class:`~moelab.costmodel.step.DecodeStepModel`), ``sim`` (barrier-synchronised DP decode ranks with a
central pool or per-engine queues), ``score`` (F-score, projections, exact subset sums), ``routers``
(BR0, BRH), ``predictors`` (oracle, Survival, ExactMatch, learned), ``sharegpt`` (real prompt text),
``experiments`` (settings, load, tuning split, paper table), ``regime`` (where the throughput gain lives).
"""

from moelab.balanceroute.cost import DPCost
from moelab.balanceroute.predictors import (
    ExactMatchPredictor,
    LearnedPredictor,
    OraclePredictor,
    SurvivalPredictor,
    make_predictor,
)
from moelab.balanceroute.routers import BR0, BRH
from moelab.balanceroute.sim import simulate

__all__ = ["BR0", "BRH", "DPCost", "ExactMatchPredictor", "LearnedPredictor", "OraclePredictor",
           "SurvivalPredictor", "make_predictor", "simulate"]
