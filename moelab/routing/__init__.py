"""One router contract for every system, plus the load-balancing baselines.

ELDR's locality band (``moelab.eldr``) and BalanceRoute's BR-0/BR-H (``moelab.balanceroute``)
implement the same :class:`Router` contract in their own folders and register themselves in
:data:`ROUTERS` when imported; :mod:`moelab.routers` (above the paper folders) imports them all. This
floor never imports a paper folder.
"""

from moelab.routing import dp_balancers  # noqa: F401  registers vLLM's and SGLang's DP balancers by version
from moelab.routing.base import (
    CALIBRATION_FIELDS,
    FIELDS,
    ROUTERS,
    UNASSIGNED,
    ActiveRequests,
    ClusterView,
    RequestBatch,
    Router,
    RouterCalibration,
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
    "CALIBRATION_FIELDS", "FIELDS", "ROUTERS", "UNASSIGNED", "ActiveRequests", "ClusterView", "RequestBatch", "Router",
    "RouterCalibration", "available_routers",
    "check_supplies", "make_router", "register_router", "requirements", "router_class", "router_names",
    "JoinShortestQueue", "LeastKVTokens", "PowerOfTwoChoices", "RandomRouter", "RoundRobin", "VLLMDataParallel",
]
