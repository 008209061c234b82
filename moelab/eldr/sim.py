"""ELDR's decode cluster is the shared decode-tier simulator (:mod:`moelab.sim.cluster`) with one rank
per instance; this module keeps ELDR's names for it.

**Rates.** ELDR states an arrival rate in one unit, the paper's: ``rate`` is req/s offered to the paper's
cluster of :data:`PAPER_DECODE_WORKERS` = 16 decode workers, so a cluster of ``K`` workers is offered
``sim_rate = rate * K / 16`` req/s (:func:`paper_rate_scale`) and every ``K`` sees the same load per worker.
Every function of :mod:`moelab.eldr.experiments` takes ``rate`` in that unit and reports both columns,
``rate`` and ``sim_rate``. The one function that makes arrivals, :func:`poisson_requests`, takes the
simulated cluster's own rate and says so by its name: ``sim_rate``.
"""

from __future__ import annotations

import numpy as np

from moelab._validate import check_array, check_instance, check_int, check_real
from moelab.costmodel.step import DecodeStepModel
from moelab.routing.base import Router
from moelab.sim.cluster import pack_expert_bits
from moelab.sim.cluster import simulate as _simulate
from moelab.sim.result import SimResult
from moelab.traces import ExpertTrace, RequestTrace, replay_requests

#: decode workers of the paper's cluster (8P16D): the unit of every ELDR arrival rate
PAPER_DECODE_WORKERS = 16


def paper_rate_scale(n_workers: int) -> float:
    """Factor from a rate in the paper's units (req/s at :data:`PAPER_DECODE_WORKERS` decode workers) to the
    rate that offers ``n_workers`` workers the same per-worker load: ``n_workers / 16``.

    Parameters
    ----------
    n_workers : int
        Decode workers ``K`` of the simulated cluster (>= 1).

    Returns
    -------
    float
        ``sim_rate / rate``: multiply a paper-unit ``rate`` by it to get the req/s the ``K`` workers are
        offered together.

    Examples
    --------
    >>> paper_rate_scale(4) * 60.0  # 60 req/s at 16 workers is 15 req/s into 4 workers
    15.0
    """
    return check_int("n_workers", n_workers, low=1) / PAPER_DECODE_WORKERS


def poisson_requests(trace: ExpertTrace, *, sim_rate: float, n_requests: int, output_len: int | np.ndarray = 512,
                     seed: int = 0, signatures: np.ndarray | None = None) -> RequestTrace:
    """Poisson arrivals replaying ``trace`` (:func:`moelab.traces.replay_requests`).

    Parameters
    ----------
    trace : ExpertTrace
        The expert trace the requests replay (each request: a uniformly drawn trace row with decode
        tokens, its prompt length and domain, from a random decode offset).
    sim_rate : float
        Arrival rate in req/s offered to the whole simulated cluster, all its workers together (> 0).
        This is *not* ELDR's paper unit: for a ``rate`` in req/s at 16 decode workers pass
        ``sim_rate=rate * paper_rate_scale(K)`` (what :func:`moelab.eldr.experiments.run_one` does).
    n_requests : int
        Requests to draw (>= 1).
    output_len : int or array of int
        Decode tokens of every request, or one per request.
    seed : int
        Seed of the arrival gaps, the rows drawn and their offsets.
    signatures : ndarray, optional
        ``[trace.n_requests, d]``: gives each request its trace row's signature.

    Returns
    -------
    RequestTrace
        Arrival times (s, first at 0), prompt and output lengths, domains, ``trace_row`` and
        ``trace_offset`` (and ``signature`` when given).
    """
    sim_rate = check_real("sim_rate", sim_rate, low=0, low_open=True)  # named as the caller named it
    return replay_requests(trace, rate=sim_rate, n_requests=n_requests, output_len=output_len, seed=seed,
                           signatures=signatures)


def simulate(requests: RequestTrace, router: Router, cost: DecodeStepModel, *, n_workers: int, trace: ExpertTrace,
             signatures: np.ndarray | None = None, slots: int = 256, bits: np.ndarray | None = None) -> SimResult:
    """ELDR's decode cluster: ``requests`` replaying ``trace`` on ``n_workers`` independent instances.

    The shared decode-tier simulator (:func:`moelab.sim.cluster.simulate`, same positional order:
    requests, router, cost) with ELDR's one addition, ``signatures``.

    Parameters
    ----------
    requests : RequestTrace
        The arrivals, with ``trace_row`` / ``trace_offset`` into ``trace`` (e.g. :func:`poisson_requests`).
    router : Router
        The instance router (e.g. :class:`moelab.eldr.ELDRRouter`, or ``make_router("jsq")``).
    cost : DecodeStepModel
        The step model at the trace's geometry (e.g. :func:`moelab.eldr.experiments.projection_cost`).
    n_workers : int
        Decode instances ``K``.
    trace : ExpertTrace
        The expert trace ``requests.trace_row`` indexes (the experts each decode step reads).
    signatures : ndarray, optional
        ``[trace.n_requests, d]``: attaches each request's trace-row signature when the requests do not
        carry one already (a router that requires ``signature`` needs them).
    slots : int
        Most running requests per instance (the batch cap).
    bits : ndarray, optional
        :func:`pack_expert_bits` of ``trace`` (saves time across runs).

    Returns
    -------
    SimResult
        Per request and per step records; ``metrics()`` gives TPOT/TTFT percentiles, throughput and the
        distinct experts per layer per step.
    """
    check_instance("trace", trace, ExpertTrace, "an ExpertTrace")
    check_instance("requests", requests, RequestTrace, "a RequestTrace (e.g. poisson_requests(trace, ...))")
    check_instance("router", router, Router, "a Router (e.g. make_router('eldr', calibration))")
    check_instance("cost", cost, DecodeStepModel, "a DecodeStepModel (e.g. DecodeStepModel.h200())")
    if signatures is not None and requests.signature is None:
        f32 = getattr(signatures, "dtype", None) == np.float32  # float32 signatures stay float32 (no np.asarray:
        # a ragged list would fail there in numpy's words; check_array names it)
        signatures = check_array("signatures", signatures, ndim=2, dtype=np.float32 if f32 else np.float64)
        if signatures.shape[0] != trace.n_requests:
            raise ValueError(f"signatures must have one row per trace request ({trace.n_requests}); "
                             f"got {signatures.shape[0]}")
        if requests.trace_row is None:
            raise ValueError("signatures are looked up by trace_row; requests have none")
        requests = requests.with_columns(signature=signatures[requests.trace_row])
    return _simulate(requests, router, cost, n_workers=n_workers, slots=slots, trace=trace, bits=bits)


__all__ = ["PAPER_DECODE_WORKERS", "SimResult", "pack_expert_bits", "paper_rate_scale", "poisson_requests",
           "simulate"]
