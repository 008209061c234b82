"""One router interface for every system, plus the load-balancing baselines.

ELDR's locality band (``moelab.eldr``) and BalanceRoute's BR-0/BR-H (``moelab.balanceroute``)
implement the same :class:`Router` interface in their own folders; :func:`make_router` finds them
by name without this package importing them at load time.
"""

from moelab.routing.base import (
    ClusterView,
    RequestBatch,
    Router,
    available_routers,
    make_router,
    register_router,
)
from moelab.routing.baselines import (
    JoinShortestQueue,
    LeastKVTokens,
    PowerOfTwoChoices,
    RandomRouter,
    RoundRobin,
    VLLMDataParallel,
)

__all__ = [
    "ClusterView", "RequestBatch", "Router", "available_routers", "make_router", "register_router",
    "JoinShortestQueue", "LeastKVTokens", "PowerOfTwoChoices", "RandomRouter", "RoundRobin", "VLLMDataParallel",
]
