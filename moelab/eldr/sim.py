"""ELDR's decode cluster is the shared decode-tier simulator (:mod:`moelab.sim.cluster`) with one rank
per instance; this module keeps ELDR's names for it."""

from __future__ import annotations

import numpy as np

from moelab._validate import check_array, check_instance
from moelab.costmodel.step import DecodeStepModel
from moelab.routing.base import Router
from moelab.sim.cluster import pack_expert_bits
from moelab.sim.cluster import simulate as _simulate
from moelab.sim.result import SimResult
from moelab.traces import ExpertTrace, RequestTrace, replay_requests


def poisson_requests(trace: ExpertTrace, *, rate: float, n_requests: int, output_len: int | np.ndarray = 512,
                     seed: int = 0, signatures: np.ndarray | None = None) -> RequestTrace:
    """Poisson arrivals replaying ``trace`` (:func:`moelab.traces.replay_requests`)."""
    return replay_requests(trace, rate=rate, n_requests=n_requests, output_len=output_len, seed=seed,
                           signatures=signatures)


def simulate(trace: ExpertTrace, requests: RequestTrace, router: Router, cost: DecodeStepModel, *, n_workers: int,
             signatures: np.ndarray | None = None, slots: int = 256, bits: np.ndarray | None = None) -> SimResult:
    """ELDR's decode cluster: ``requests`` replaying ``trace`` on ``n_workers`` independent instances.
    ``signatures`` ([trace.n_requests, d]) attaches each request's trace-row signature when the
    requests do not carry one already."""
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


__all__ = ["SimResult", "pack_expert_bits", "poisson_requests", "simulate"]
