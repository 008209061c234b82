"""Per-request latency metrics (TTFT, TPOT, end-to-end) and load-imbalance measures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from moelab._validate import _as_array, check_array, check_counts, check_finite_array


def percentiles(x: np.ndarray, qs: Sequence[float] = (50, 95, 99)) -> dict[str, float]:
    """``{"p50": ..., "p95": ..., ...}`` of ``x`` (NaN when ``x`` is empty; ``qs`` in ``[0, 100]``)."""
    x = _as_array("x", x, what="an array of numbers").astype(np.float64)  # None is refused, not read as NaN
    qs = check_finite_array("qs", qs, ndim=1, low=0, high=100).tolist()
    if x.size == 0:
        return {f"p{q:g}": float("nan") for q in qs}
    return {f"p{q:g}": float(v) for q, v in zip(qs, np.percentile(x, qs))}


@dataclass(frozen=True)
class LatencySummary:
    """Run-level latency and throughput figures (milliseconds, tokens/s)."""

    n_requests: int
    tpot_ms_p50: float
    tpot_ms_p95: float
    tpot_ms_p99: float
    ttft_ms_p50: float
    ttft_ms_p95: float
    ttft_ms_p99: float
    e2e_s_p50: float
    throughput_tok_s: float
    makespan_s: float

    def as_dict(self) -> dict[str, float]:
        """The summary as a flat dict."""
        return asdict(self)


def summarize_requests(
    arrival_s: np.ndarray,
    first_token_s: np.ndarray,
    finish_s: np.ndarray,
    output_len: np.ndarray,
) -> LatencySummary:
    """Summarise finished requests. TPOT = (finish - first token) / (output_len - 1) for requests
    with more than one token; TTFT = first token - arrival; throughput = tokens / makespan."""
    # named checks: a scalar or a length mismatch used to end in numpy's IndexError or broadcast words
    arrival = check_array("arrival_s", arrival_s, ndim=1, dtype=np.float64)
    n = arrival.shape[0]
    first = _as_array("first_token_s", first_token_s, np.float64, "a 1-d array of times (s)")
    finish = _as_array("finish_s", finish_s, np.float64, "a 1-d array of times (s)")
    out = check_counts("output_len", output_len, ndim=1)
    for name, arr in (("first_token_s", first), ("finish_s", finish), ("output_len", out)):
        if arr.shape != (n,):
            raise ValueError(f"{name} must be a 1-d array with one entry per request (arrival_s has {n}); "
                             f"got shape {arr.shape}")
    multi = out > 1
    tpot = (finish[multi] - first[multi]) / (out[multi] - 1) * 1e3
    ttft = (first - arrival) * 1e3
    tp, tt = percentiles(tpot), percentiles(ttft)
    makespan = float(finish.max() - arrival.min()) if finish.size else 0.0
    return LatencySummary(
        int(arrival.size), tp["p50"], tp["p95"], tp["p99"], tt["p50"], tt["p95"], tt["p99"],
        percentiles(finish - arrival, (50,))["p50"], float(out.sum() / makespan) if makespan > 0 else float("nan"), makespan,
    )


def imbalance(loads: np.ndarray) -> np.ndarray:
    """Barrier idle work ``G*max - sum`` of worker loads (last axis = workers; finite, at least one worker)."""
    loads = check_finite_array("loads", loads)
    if loads.ndim == 0 or loads.shape[-1] == 0:
        raise ValueError(f"loads must have a last axis of workers (at least one); got shape {loads.shape}")
    return loads.shape[-1] * loads.max(axis=-1) - loads.sum(axis=-1)
