"""One router contract for every system, plus the load-balancing baselines.

ELDR's locality band (``moelab.eldr``) and BalanceRoute's BR-0/BR-H (``moelab.balanceroute``)
implement the same :class:`Router` contract in their own folders and register themselves in
:data:`ROUTERS` when imported; :mod:`moelab.routers` (above the paper folders) imports them all. This
floor never imports a paper folder.

A router of your own: subclass :class:`Router`, override :meth:`Router.choose` (one request) or
:meth:`Router.route_batch` (a whole batch), declare the fields it reads in ``requires`` and register it
with :func:`register_router`; it then runs in every driver that supplies those fields (the DP and
decode-cluster simulators, the cross-paper experiment, ``moelab serve-router``).
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
    RouterError,
    available_routers,
    call_router,
    check_routed,
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
    "RouterCalibration", "RouterError", "available_routers", "call_router", "check_routed",
    "check_supplies", "make_router", "register_router", "requirements", "router_class", "router_names",
    "JoinShortestQueue", "LeastKVTokens", "PowerOfTwoChoices", "RandomRouter", "RoundRobin", "VLLMDataParallel",
]
