"""BalanceRoute: online data-parallel load balancing for LLM decode (BR-0, BR-H).

The physics lives on the floor: the barrier step time of DP-attention + EP ranks is
:class:`moelab.costmodel.dp.DPCost` and the barrier-synchronised DP ranks are simulated by
:func:`moelab.sim.dp.simulate_dp`. Modules here: ``score`` (F-score, projections, exact subset sums), ``routers``
(BR0, BRH), ``predictors`` (oracle, Survival, ExactMatch, learned), ``sharegpt`` (real prompt text),
``experiments`` (settings, load, tuning split, paper table), ``regime`` (where the throughput gain lives).
"""

from moelab.balanceroute.predictors import (
    ExactMatchPredictor,
    LearnedPredictor,
    OraclePredictor,
    Predictor,
    SurvivalPredictor,
    make_predictor,
)
from moelab.balanceroute.routers import BR0, BRH

__all__ = ["BR0", "BRH", "ExactMatchPredictor", "LearnedPredictor", "OraclePredictor", "Predictor",
           "SurvivalPredictor", "make_predictor"]
