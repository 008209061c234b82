"""One router contract for every system, plus the load-balancing baselines.

ELDR's locality band (``moelab.eldr``) and BalanceRoute's BR-0/BR-H (``moelab.balanceroute``)
implement the same :class:`Router` contract in their own folders; :data:`ROUTERS` is the one registry
of names and finds them on first use, without this package importing them at load time.
"""

from moelab.routing import dp_balancers  # noqa: F401  registers vLLM's and SGLang's DP balancers by version
from moelab.routing.base import (
    FIELDS,
    ROUTERS,
    UNASSIGNED,
    ActiveRequests,
    ClusterView,
    RequestBatch,
    Router,
    available_routers,
    check_supplies,
    make_router,
    register_router,
    requirements,
    router_class,
    router_names,
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
    "FIELDS", "ROUTERS", "UNASSIGNED", "ActiveRequests", "ClusterView", "RequestBatch", "Router", "available_routers",
    "check_supplies", "make_router", "register_router", "requirements", "router_class", "router_names",
    "JoinShortestQueue", "LeastKVTokens", "PowerOfTwoChoices", "RandomRouter", "RoundRobin", "VLLMDataParallel",
]
