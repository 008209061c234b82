"""Exercises of notebook 01 (ELDR): the paper's rate units, the locality band, and the band rule with its guard.

The band and the routing decisions are computed by :class:`moelab.eldr.routing.ELDRRouter` itself, on toy
inputs where the similarities are given directly (identity centroids: ``s_j = c_j . v = v_j``), so a
student's answer is checked against what the router really does, never against a typed number.
:func:`toy_routing` builds the notebook's worked example (a few requests, two workers) the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from moelab._validate import check_array as check_input_array
from moelab._validate import check_int, check_real
from moelab.course.check import (
    Feedback,
    _describe,
    check_array,
    check_callable,
    check_number,
    exercise,
)
from moelab.eldr import PAPER_DECODE_WORKERS, paper_rate_scale
from moelab.eldr.routing import ELDRRouter
from moelab.routing.base import ClusterView, RequestBatch

NOTEBOOK = "01"
#: free slots of a toy worker: large enough never to bind, so only similarity and load decide
_TOY_SLOTS = 1 << 20
#: the notebook's defaults (its parameters cell) and the band exercise's similarities; the tests use these
DEFAULTS: dict[str, object] = {"N_WORKERS": 4, "ABLATION_RATE": 100.0, "TAU": 0.1,
                               "SIMILARITIES": (0.62, 0.55, 0.31, 0.58)}


def route_one(similarities: Sequence[float], loads: Sequence[int], tau: float, *, spill: float | None = 1.0) -> int:
    """The worker ELDR's router picks for one request with the given similarities ``s_j`` and loads.

    Parameters
    ----------
    similarities : sequence of float
        ``s_j = c_j . v`` for each worker ``j`` (cosines, in [-1, 1]).
    loads : sequence of int
        In-flight requests per worker (running + waiting), >= 0.
    tau : float
        Band width, >= 0.
    spill : float or None
        The load guard's spill (the router's default); ``None`` turns the guard off.

    Returns
    -------
    int
        The chosen worker. Ties in the band's least load are broken by the router's seeded draw.
    """
    s = check_input_array("similarities", similarities, ndim=1, dtype=np.float64)
    n = check_input_array("loads", loads, ndim=1, dtype=np.int64)
    if s.shape != n.shape or s.size < 1:
        raise ValueError(f"similarities and loads must have one entry per worker; got {s.shape} and {n.shape}")
    if (n < 0).any():
        raise ValueError(f"loads must be >= 0; got {n.tolist()}")
    router = ELDRRouter(np.eye(s.size), tau=check_real("tau", tau, low=0), spill=spill, seed=0)
    view = ClusterView(active=n, kv_tokens=np.zeros_like(n), free_slots=np.full(n.shape, _TOY_SLOTS))
    return int(router.route(RequestBatch(prompt_len=[1], signature=s[None, :]), view)[0])


def band_members(similarities: Sequence[float], tau: float) -> np.ndarray:
    """1 for each worker in the locality band of ``similarities`` at width ``tau``, else 0.

    Asked of the router itself: worker ``j`` is in the band exactly when, with the guard off and ``j`` the
    only idle worker (every other one holding a request), the router picks ``j``.
    """
    s = check_input_array("similarities", similarities, ndim=1, dtype=np.float64)
    member = np.zeros(s.size, dtype=np.int64)
    for j in range(s.size):
        loads = np.ones(s.size, dtype=np.int64)
        loads[j] = 0
        member[j] = route_one(s, loads, tau, spill=None) == j
    return member


def toy_routing(counts: np.ndarray, centroids: np.ndarray, loads: Sequence[int], tau: float) -> pd.DataFrame:
    """ELDR's decisions for a few toy requests, one at a time, as a table to check by hand.

    Parameters
    ----------
    counts : [n, E] array
        Each request's prefill expert counts (one MoE layer is enough for a toy).
    centroids : [K, E] array
        One centroid per decode worker (normalised by the router).
    loads : sequence of int
        In-flight requests per worker before the first request arrives.
    tau : float
        Band width, >= 0.

    Returns
    -------
    pandas.DataFrame
        Per request: its counts, signature ``v``, similarities ``s_j``, the band, the loads it saw, whether
        the guard sent it out of the band, and the chosen worker (each request then adds one to that load).
    """
    C = check_input_array("counts", counts, ndim=2, dtype=np.float64)
    W = check_input_array("centroids", centroids, ndim=2, dtype=np.float64)
    if C.shape[1] != W.shape[1]:
        raise ValueError(f"counts and centroids must have the same number of experts; got {C.shape[1]} and {W.shape[1]}")
    load = check_input_array("loads", loads, ndim=1, dtype=np.int64).copy()
    if load.shape != (W.shape[0],):
        raise ValueError(f"loads must have one entry per centroid ({W.shape[0]}); got shape {load.shape}")
    W = W / np.linalg.norm(W, axis=1, keepdims=True)
    rows = []
    for i, c in enumerate(C):
        v = c / np.linalg.norm(c)
        s = W @ v
        band = np.flatnonzero(band_members(s, tau))
        worker = route_one(s, load, tau)
        rows.append({"request": f"r{i}", "counts C": c.astype(int).tolist(), "signature v": np.round(v, 3).tolist(),
                     **{f"s_{j}": round(float(x), 3) for j, x in enumerate(s)},
                     "band": band.tolist(), "loads before": load.tolist(),
                     "guard fired": bool(worker not in band), "worker": worker})
        load[worker] += 1
    return pd.DataFrame(rows)


# 01.sim_rate (easy) ----------------------------------------------------------------------------------
def _sim_rate(N_WORKERS: int, ABLATION_RATE: float) -> float:
    return float(ABLATION_RATE) * paper_rate_scale(check_int("N_WORKERS", N_WORKERS, low=1))


def check_sim_rate(answer: object, *, N_WORKERS: int, ABLATION_RATE: float, **_: object) -> Feedback:
    """The arrival rate the simulator runs for the paper's ``ABLATION_RATE`` on ``N_WORKERS`` workers."""
    want = _sim_rate(N_WORKERS, ABLATION_RATE)
    rate, k, paper_k = float(ABLATION_RATE), int(N_WORKERS), PAPER_DECODE_WORKERS
    # the usual slips, each named (a slip equal to the right answer, e.g. at K = 16, is not one)
    slips = [(value, what) for value, what in (
        (rate, f"that is the paper's rate itself: it is offered to the paper's {paper_k} decode workers, not to K"),
        (rate * paper_k / k, f"the scale is inverted: the rate is multiplied by K/{paper_k}, not {paper_k}/K (" +
         (f"K = {k} is fewer workers than the paper's {paper_k}, so they get less traffic, not more)" if k < paper_k
          else f"K = {k} is more workers than the paper's {paper_k}, so they get more traffic, not less)")),
        (rate / k, "that is one worker's share of the paper's rate spread over K workers, not the cluster's rate"),
        (rate / paper_k, "that is the load of ONE worker (req/s per worker), not the whole cluster's rate"))
        if not np.isclose(value, want, rtol=0.01)]
    return check_number("sim_rate", answer, want, rtol=0.01,
                        hint=f"the paper's rates are req/s at {PAPER_DECODE_WORKERS} decode workers; with "
                             f"K = {N_WORKERS} each worker keeps its load when the rate is scaled by "
                             f"K/{PAPER_DECODE_WORKERS} (the explore panel's title shows it).", slips=slips)


def _zeros_and_ones(answer: object, size: int) -> bool:
    """Whether ``answer`` is a flat sequence of ``size`` numbers, each 0 or 1 (True/False count as 1/0)."""
    if answer is None or isinstance(answer, (str, bytes, bool, dict)) or callable(answer):
        return False
    try:
        values = np.asarray(answer, dtype=float)
    except (TypeError, ValueError):
        return False
    return values.shape == (size,) and bool(np.isin(values, (0.0, 1.0)).all())


# 01.band (medium) ------------------------------------------------------------------------------------
def check_band(answer: object, *, SIMILARITIES: Sequence[float], TAU: float, **_: object) -> Feedback:
    """Band membership (1 in, 0 out) per worker for the given similarities at width ``TAU``."""
    want = band_members(SIMILARITIES, TAU)
    if not _zeros_and_ones(answer, want.size):
        return Feedback(False, f"expected one 0 or 1 per worker for `band` ({want.size} numbers, in worker order), "
                               f"got {_describe(answer)}. Hint: a worker is in the band when "
                               f"s_j >= max_j s_j - tau (tau = {TAU:g}).")
    return check_array("band", answer, want, rtol=0.0, atol=0.0,
                       hint=f"a worker is in the band when s_j >= max_j s_j - tau (tau = {TAU:g}); answer with one "
                            "0 or 1 per worker, in worker order.")


# 01.tau_jsq (medium, predict a regime) --------------------------------------------------------------
#: the range of a cosine similarity between any two vectors: section 2's bound (tau >= 2 makes ELDR plain JSQ)
COSINE_RANGE = (-1.0, 1.0)
#: the range of a cosine between this lab's signatures and centroids: every coordinate of a signature is a count
#: (or summed gate probability) times a weight >= 0, and a centroid is a normalised mean of signatures, so none
#: is negative and their cosine is never below 0; it is 0 for two requests with no expert in common
SIGNATURE_COSINE_RANGE = (0.0, 1.0)


def _tau_jsq() -> float:
    """The widest gap between two of this lab's cosines: at this band width every worker is always in the band."""
    return SIGNATURE_COSINE_RANGE[1] - SIGNATURE_COSINE_RANGE[0]


def check_tau_jsq(answer: object, **_: object) -> Feedback:
    """The smallest band width at which every worker is in the band for ANY signature of this lab (ELDR = JSQ)."""
    general = COSINE_RANGE[1] - COSINE_RANGE[0]
    feedback = check_number(
        "tau_jsq", answer, _tau_jsq(), rtol=0.0, atol=1e-9,
        hint="the band is every worker when max_j s_j - tau <= min_j s_j for every possible signature; can a "
             "signature or a centroid of this lab have a negative coordinate? Then how far apart can two of its "
             "cosines be?",
        slips=[(general, f"tau = {general:g} is section 2's bound for any two cosines; it makes ELDR plain JSQ here "
                         "too, but it is not the smallest such width")])
    if feedback.ok:  # ask the router too: at this width the best and the worst possible worker share the band
        extreme = [SIGNATURE_COSINE_RANGE[1], SIGNATURE_COSINE_RANGE[0]]
        if not band_members(extreme, _tau_jsq()).all():
            return Feedback(False, "the router disagrees: at this tau its band is not every worker.")
    return feedback


# 01.route (hard) -------------------------------------------------------------------------------------
#: toy decisions (similarities, loads, tau) with no tie at the least load, chosen to exercise every branch:
#: the band's least loaded, the guard sending a request to the idle worker, tau = 0 (no guard), tau >= 2 (JSQ)
_ROUTE_ARGS = (
    ((0.9, 0.85, 0.2), (3, 1, 0), 0.1),
    ((0.9, 0.1, 0.2), (5, 2, 0), 0.1),
    ((0.9, 0.1, 0.2), (5, 2, 0), 0.0),
    ((0.9, 0.1, 0.2), (5, 2, 1), 2.0),
    ((0.3, 0.8, 0.75, 0.1), (4, 6, 2, 3), 0.1),
    ((0.3, 0.8, 0.75, 0.1), (0, 3, 2, 1), 0.1),
)


def _route_cases() -> list[tuple[tuple, float]]:
    return [(args, float(route_one(*args))) for args in _ROUTE_ARGS]


def check_route(answer: object, **_: object) -> Feedback:
    """A function route(s, loads, tau) implementing the band rule with its guard (spill 1)."""
    return check_callable("route", answer, _route_cases(), rtol=0.0,
                          hint="band = {j : s_j >= max s - tau}; pick the least loaded in the band; but when tau > 0 "
                               "and that load exceeds 2 * min(loads) + 1, pick the least loaded worker overall. "
                               "With tau = 0 the guard is off.")


def _solution_route(s: Sequence[float], loads: Sequence[int], tau: float) -> int:
    s, loads = np.asarray(s, dtype=float), np.asarray(loads)
    band = np.flatnonzero(s >= s.max() - tau)
    best = band[np.argmin(loads[band])]
    if tau > 0 and loads[best] > 2 * loads.min() + 1:
        best = int(np.argmin(loads))
    return int(best)


def _wrong_route(s: Sequence[float], loads: Sequence[int], tau: float) -> int:
    """The typical slip: the band rule without its guard."""
    s, loads = np.asarray(s, dtype=float), np.asarray(loads)
    band = np.flatnonzero(s >= s.max() - tau)
    return int(band[np.argmin(loads[band])])


exercise(NOTEBOOK, "sim_rate", "easy",
         "The paper's ABLATION_RATE is req/s at 16 decode workers. What rate (req/s over the whole cluster) does "
         "the simulator run on this notebook's N_WORKERS workers?",
         check_sim_rate, solution=lambda **ctx: _sim_rate(ctx["N_WORKERS"], ctx["ABLATION_RATE"]),
         wrong=lambda **ctx: float(ctx["ABLATION_RATE"]), context=DEFAULTS)
exercise(NOTEBOOK, "band", "medium",
         "For the similarities SIMILARITIES and band width TAU, which workers are in the locality band? "
         "One 0 or 1 per worker.",
         check_band, solution=lambda **ctx: band_members(ctx["SIMILARITIES"], ctx["TAU"]).tolist(),
         # the typical slip: only the best worker (tau read as 0)
         wrong=lambda **ctx: band_members(ctx["SIMILARITIES"], 0.0).tolist(), context=DEFAULTS)
exercise(NOTEBOOK, "tau_jsq", "medium",
         "This lab's signatures and centroids have no negative coordinate. From which band width tau on does "
         "ELDR route exactly like JSQ, whatever the signatures?",
         check_tau_jsq, solution=lambda **ctx: _tau_jsq(),
         # the typical slip: section 2's bound for any two cosines, not the smallest width for this lab's
         wrong=lambda **ctx: COSINE_RANGE[1] - COSINE_RANGE[0], context=DEFAULTS)
exercise(NOTEBOOK, "route", "hard",
         "Implement route(s, loads, tau): the band rule with its guard, returning the chosen worker.",
         check_route, solution=lambda **ctx: _solution_route, wrong=lambda **ctx: _wrong_route, context=DEFAULTS)

__all__ = ["COSINE_RANGE", "DEFAULTS", "SIGNATURE_COSINE_RANGE", "band_members", "check_band", "check_route",
           "check_sim_rate", "check_tau_jsq", "route_one", "toy_routing"]
