"""The one simulation result: per-request and per-step records and one ``metrics()``; and the one
"gain over the best baseline" helper."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from moelab.sim.metrics import LatencySummary, percentiles, summarize_requests

REQUEST_COLUMNS = ("arrival_s", "prompt_len", "output_len", "worker", "admit_s", "first_token_s", "finish_s")


@dataclass
class SimResult:
    """Records of one simulated run.

    ``requests``: one row per request with at least :data:`REQUEST_COLUMNS` (seconds from the first
    arrival; ``admit_s`` when the request started decoding, ``first_token_s`` the end of its first
    decode step — TTFT-at-decode, prefill is not simulated). ``steps``: one row per simulated step
    (at least ``t_s`` and ``step_ms``; ``worker``, ``batch``, ``sum_distinct`` and load columns where
    the simulator records them). ``router``, ``n_workers``, ``slots`` (the per-worker batch cap),
    ``num_layers`` (MoE layers ``sum_distinct`` sums over), ``info`` (anything else, reported as is).
    """

    requests: pd.DataFrame
    steps: pd.DataFrame
    router: str
    n_workers: int
    slots: int
    num_layers: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [c for c in REQUEST_COLUMNS if c not in self.requests.columns]
        if missing:
            raise ValueError(f"requests lacks column(s) {missing}; required: {list(REQUEST_COLUMNS)}")
        if "step_ms" not in self.steps.columns:
            raise ValueError("steps must have a step_ms column")

    # ------------------------------------------------------------------ per-request arrays
    @property
    def worker(self) -> np.ndarray:
        """Worker (instance) of every request."""
        return self.requests["worker"].to_numpy()

    @property
    def first_token_s(self) -> np.ndarray:
        """End of every request's first decode step (s)."""
        return self.requests["first_token_s"].to_numpy()

    @property
    def finish_s(self) -> np.ndarray:
        """Finish time of every request (s)."""
        return self.requests["finish_s"].to_numpy()

    @property
    def summary(self) -> LatencySummary:
        """Latency and throughput summary of the run (:func:`summarize_requests`)."""
        r = self.requests
        return summarize_requests(r["arrival_s"].to_numpy(), r["first_token_s"].to_numpy(), r["finish_s"].to_numpy(),
                                  r["output_len"].to_numpy())

    # ------------------------------------------------------------------ one flat metrics dict
    def metrics(self) -> dict[str, Any]:
        """Latency summary, queueing delay, and per-step figures: mean distinct experts per layer per
        step (per step and token-weighted), mean batch and step time, per-worker request-count CV,
        and — where the steps record loads — the barrier imbalance ``G*max - sum``."""
        st = self.steps
        n = len(st)
        out: dict[str, Any] = {"router": self.router, "n_workers": self.n_workers, "slots": self.slots,
                               **self.summary.as_dict()}
        queue = (self.requests["admit_s"] - self.requests["arrival_s"]).to_numpy()
        q = percentiles(queue[np.isfinite(queue)], (50, 95, 99))
        out.update({"queue_s_mean": float(np.nanmean(queue)) if queue.size else float("nan"),
                    "queue_s_p50": q["p50"], "queue_s_p95": q["p95"], "queue_s_p99": q["p99"]})
        if "sum_distinct" in st.columns and self.num_layers:
            per_layer = st["sum_distinct"].to_numpy() / self.num_layers
            b = st["batch"].to_numpy()
            out["distinct_per_layer_step"] = float(per_layer.mean()) if n else float("nan")
            out["distinct_per_layer_tokenweighted"] = float((per_layer * b).sum() / max(b.sum(), 1))
        if "batch" in st.columns:
            out["mean_batch"] = float(st["batch"].mean()) if n else float("nan")
        out["step_ms_mean"] = float(st["step_ms"].mean()) if n else float("nan")
        out["n_steps"] = int(n)
        w = self.worker
        counts = np.bincount(w[w >= 0], minlength=self.n_workers) if w.size else np.zeros(1)
        out["worker_load_cv"] = float(counts.std() / max(counts.mean(), 1e-12))
        if {"max_load", "sum_load"} <= set(st.columns) and n:
            g = int(st["ranks"].iloc[0]) if "ranks" in st.columns else self.n_workers
            out["avg_imbalance"] = float((g * st["max_load"] - st["sum_load"]).mean())
        if "decision_ms" in st.columns:
            d = st["decision_ms"].to_numpy()
            dq = percentiles(d[np.isfinite(d)], (50, 99))
            out["decision_ms_p50"], out["decision_ms_p99"] = dq["p50"], dq["p99"]
        return {**out, **self.info}


def gain_vs_best(results: Mapping[str, Mapping[str, float]], method: str, baselines: Collection[str], *,
                 metric: str = "tpot_ms_p50", higher_is_better: bool = False) -> tuple[float, str]:
    """``(gain %, best baseline)``: how much ``method`` improves ``metric`` over the best of
    ``baselines`` (lower is better unless ``higher_is_better``). Positive = better than every baseline.

    ``results`` maps a name to its metrics dict (e.g. ``{name: SimResult.metrics()}``)."""
    if method not in results:
        raise ValueError(f"method must be one of {sorted(results)}; got {method!r}")
    base = [b for b in baselines if b in results and b != method]
    if not base:
        raise ValueError(f"none of the baselines {sorted(baselines)} is in results ({sorted(results)})")
    vals = {b: float(results[b][metric]) for b in base}
    if higher_is_better:
        best = max(vals, key=vals.get)
        return 100.0 * (float(results[method][metric]) / vals[best] - 1.0), best
    best = min(vals, key=vals.get)
    return 100.0 * (1.0 - float(results[method][metric]) / vals[best]), best


def gains_table(df: pd.DataFrame, method: str, baselines: Collection[str], *, by: str | list[str] = "rate",
                metric: str = "tpot_ms_p50", name_col: str = "router", higher_is_better: bool = False) -> pd.DataFrame:
    """:func:`gain_vs_best` per group of a long table (one row per run, ``name_col`` the method)."""
    rows = []
    for key, g in df.groupby(by, sort=True):
        res = {r[name_col]: r for r in g.to_dict("records")}
        if method not in res or not any(b in res for b in baselines):
            continue
        gain, best = gain_vs_best(res, method, baselines, metric=metric, higher_is_better=higher_is_better)
        keys = dict(zip([by] if isinstance(by, str) else by, key if isinstance(key, tuple) else (key,)))
        rows.append({**keys, "best_baseline": best, f"baseline_{metric}": res[best][metric],
                     f"{method}_{metric}": res[method][metric], "gain_pct": gain})
    return pd.DataFrame(rows)


__all__ = ["REQUEST_COLUMNS", "SimResult", "gain_vs_best", "gains_table"]
