"""The one simulation result: per-request and per-step records and one ``metrics()``; and the one
"gain over the best baseline" helper."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from moelab._validate import check_choice, check_instance, check_real
from moelab.sim.metrics import LatencySummary, percentiles, summarize_requests

REQUEST_COLUMNS = ("arrival_s", "prompt_len", "output_len", "worker", "admit_s", "first_token_s", "finish_s")
REQUEST_SCOPES = ("all", "window")  # MeasurementWindow.requests: every request, or those arriving in the window


@dataclass(frozen=True)
class MeasurementWindow:
    """Which simulated steps the run-level *step* figures (imbalance, idle fraction, step time, windowed
    throughput) average over, and which requests the latency figures cover.

    A cluster filling up from empty takes about one request lifetime (the mean output length, in steps),
    so ``warmup_lifetimes`` of them are skipped (at most half the busy steps), then ``warmup_frac`` of the
    rest. Where the steps record admissions (``n_admitted``) the window ends at the last admission: the
    drain tail has no routing decisions left and only lowers occupancy. The default (no warm-up, every
    request) is the whole run.

    Parameters
    ----------
    warmup_lifetimes : float
        Request lifetimes (mean ``output_len`` steps each; in the decode-cluster simulator, where each
        ``steps`` row is one worker's step, about ``K * output_len`` rows) skipped at the start, in
        ``[0, 10]``.
    warmup_frac : float
        Share of the remaining busy steps skipped after that, in ``[0, 1)``.
    requests : {"all", "window"}
        Which requests the latency figures (``tpot_ms_*``, ``ttft_ms_*``, ``e2e_s_p50``, ``queue_s_*``)
        cover. ``"all"`` (the default, and what every simulator's stated window uses): every request,
        whatever the steps. ``"window"``: the steady-state ones, exactly those whose ``arrival_s`` lies
        between the earliest and the latest ``t_s`` of the window's steps (both ends included; ``t_s`` is
        a step's start in the decode-cluster simulator and its end in the DP one). Requests arriving
        during the skipped fill-up, or after the window's end (past the last admission where the steps
        record admissions), are left out; ``metrics()`` reports the span (``latency_from_s``,
        ``latency_to_s``) and how many requests it holds (``latency_requests``). Run totals
        (``n_requests``, ``makespan_s``, ``throughput_run_tok_s``, the per-worker request-count CV) always
        cover every request.
    """

    warmup_lifetimes: float = 0.0
    warmup_frac: float = 0.0
    requests: str = "all"

    def __post_init__(self) -> None:
        check_real("warmup_lifetimes", self.warmup_lifetimes, low=0, high=10)
        check_real("warmup_frac", self.warmup_frac, low=0, high=1, high_open=True)
        check_choice("requests", self.requests, REQUEST_SCOPES)

    def span(self, steps: pd.DataFrame, mean_output_len: float) -> tuple[float, float]:
        """``(first, last)``: the earliest and latest ``t_s`` of the window's steps (NaN, NaN when the
        window holds no step): ``requests="window"`` keeps the requests arriving in it, both ends included.

        Parameters
        ----------
        steps : DataFrame
            A run's steps (:attr:`SimResult.steps`, with ``t_s``).
        mean_output_len : float
            The run's mean output length (one request lifetime, in steps).

        Returns
        -------
        tuple of float
            The span's ends, seconds from the first arrival.
        """
        ws, _ = self.select(steps, mean_output_len)
        if not len(ws) or "t_s" not in ws.columns:
            return float("nan"), float("nan")
        t = ws["t_s"].to_numpy(np.float64)
        return float(t.min()), float(t.max())

    def select(self, steps: pd.DataFrame, mean_output_len: float) -> tuple[pd.DataFrame, int]:
        """The window's steps of ``steps`` and how many busy steps the warm-up skipped.

        Parameters
        ----------
        steps : DataFrame
            A run's steps (:attr:`SimResult.steps`).
        mean_output_len : float
            The run's mean output length (one request lifetime, in steps).

        Returns
        -------
        tuple
            ``(window steps, skipped busy steps)``.
        """
        end = len(steps)
        if "n_admitted" in steps.columns:
            last_adm = np.flatnonzero(steps["n_admitted"].to_numpy() > 0)
            end = int(last_adm[-1]) + 1 if last_adm.size else len(steps)
        busy = steps.iloc[:end]
        if "n_active" in busy.columns:
            busy = busy[busy["n_active"] > 0]
        skip = min(int(round(self.warmup_lifetimes * mean_output_len)), len(busy) // 2)
        busy = busy.iloc[skip:]
        skip_frac = int(len(busy) * self.warmup_frac)
        return busy.iloc[skip_frac:], skip + skip_frac


@dataclass
class SimResult:
    """Records of one simulated run.

    ``requests``: one row per request with at least :data:`REQUEST_COLUMNS` (seconds from the first
    arrival; ``admit_s`` when the request started decoding, ``first_token_s`` the end of its first
    decode step — TTFT-at-decode, prefill is not simulated). ``steps``: one row per simulated step
    (at least ``t_s`` and ``step_ms``; ``worker``, ``batch``, ``sum_distinct``, load and count columns
    where the simulator records them). ``router``, ``n_workers``, ``slots`` (the per-worker batch cap),
    ``num_layers`` (MoE layers ``sum_distinct`` sums over), ``window`` (the measurement window the
    simulator states as its default), ``info`` (run settings, reported as is; never a metric's name).
    """

    requests: pd.DataFrame
    steps: pd.DataFrame
    router: str
    n_workers: int
    slots: int
    num_layers: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    window: MeasurementWindow = field(default_factory=MeasurementWindow)

    def __post_init__(self) -> None:
        missing = [c for c in REQUEST_COLUMNS if c not in self.requests.columns]
        if missing:
            raise ValueError(f"requests lacks column(s) {missing}; required: {list(REQUEST_COLUMNS)}")
        if "step_ms" not in self.steps.columns:
            raise ValueError("steps must have a step_ms column")
        ms = pd.to_numeric(self.steps["step_ms"], errors="coerce").to_numpy(np.float64)
        bad = ~np.isfinite(ms) | (ms < 0)
        if bad.any():  # an inf/NaN cost would otherwise come back as plausible-looking inf/NaN metrics
            i = int(np.argmax(bad))
            raise ValueError(f"steps.step_ms must be finite and >= 0 (the cost model gave {ms[i]!r} at step {i}): "
                             "check the cost model's coefficients and inputs")
        if not isinstance(self.window, MeasurementWindow):
            raise ValueError(f"window must be a MeasurementWindow; got {type(self.window).__name__}")

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
    def metrics(self, window: MeasurementWindow | None = None) -> dict[str, Any]:
        """Every run-level figure in one flat dict.

        Parameters
        ----------
        window : MeasurementWindow, optional
            The steps the step figures average over and the requests the latency figures cover (default:
            the simulator's stated ``self.window``, which covers every request). For steady-state
            latencies pass one with ``requests="window"``: then TPOT, TTFT, end-to-end and queueing
            figures cover only the requests arriving inside the window's span
            (:class:`MeasurementWindow`), ``latency_requests`` says how many they are and
            ``latency_from_s`` / ``latency_to_s`` give the span.

        Returns
        -------
        dict
            Latency summary over the window's requests (every request unless ``window.requests ==
            "window"``; ``n_requests``, ``makespan_s`` and ``throughput_run_tok_s`` = tokens / makespan
            always over every request), queueing delay, ``warmup_steps`` / ``window_steps``; over the window's steps: mean distinct experts per
            layer per step (per step and token-weighted), mean batch, ``step_ms_mean``, and where the steps
            record them the barrier imbalance ``G*max - sum`` (``avg_imbalance``, ``avg_max_minus_min``,
            ``idle_fraction`` weighted by step time), running requests (``mean_active``, ``mean_rank_load``)
            and ``throughput_tok_s`` as tokens per second of the window's steps (else the run-level one);
            router decision times over all steps; per-worker request-count CV; then ``info``. Every
            computed figure is a plain Python ``float`` / ``int`` (never a numpy scalar); ``info`` is as given.

            Units: ``tpot_ms_*``, ``ttft_ms_*`` (TTFT at decode: admission wait plus the first decode step)
            and ``step_ms_mean`` in milliseconds; ``e2e_s_p50``, ``queue_s_*``, ``makespan_s`` in seconds;
            ``throughput_tok_s`` and ``throughput_run_tok_s`` in decode tokens per second (the whole
            cluster); ``avg_imbalance`` in KV tokens, per step ``G * max - sum`` of the ranks' KV loads
            (the token-steps the barrier leaves idle), averaged over the window's steps, and
            ``avg_max_minus_min`` in KV tokens too; ``idle_fraction`` a share in ``[0, 1]``, per step
            ``1 - sum / (G * max)`` of those loads, averaged weighted by step time; ``mean_active`` in
            running requests (the cluster), ``mean_rank_load`` in KV tokens per rank, ``mean_batch`` in
            requests per step; ``distinct_per_layer_*`` in experts; ``decision_ms_*`` in milliseconds per
            step and ``decision_us_per_request_p50`` in microseconds; ``warmup_steps``, ``window_steps``,
            ``n_steps`` count ``steps`` rows; ``worker_load_cv`` is dimensionless.
        """
        window = self.window if window is None else window
        if not isinstance(window, MeasurementWindow):
            raise ValueError(f"window must be a MeasurementWindow or None; got {type(window).__name__}")
        st = self.steps
        req = self.requests
        lat = self.summary
        out: dict[str, Any] = {"router": self.router, "n_workers": self.n_workers, "slots": self.slots,
                               **lat.as_dict(), "throughput_run_tok_s": lat.throughput_tok_s}
        if window.requests == "window":  # steady-state latencies: the requests arriving inside the window
            first, last = window.span(st, float(req["output_len"].mean()))
            arr = req["arrival_s"].to_numpy(np.float64)
            req = req[(arr >= first) & (arr <= last)]  # NaN span (no window step): no request
            sub = summarize_requests(req["arrival_s"].to_numpy(), req["first_token_s"].to_numpy(),
                                     req["finish_s"].to_numpy(), req["output_len"].to_numpy()).as_dict()
            out.update({k: v for k, v in sub.items() if k.startswith(("tpot_", "ttft_", "e2e_"))})
            out["latency_requests"] = int(len(req))
            out["latency_from_s"], out["latency_to_s"] = first, last
        queue = (req["admit_s"] - req["arrival_s"]).to_numpy()
        fin = queue[np.isfinite(queue)]
        q = percentiles(fin, (50, 95, 99))
        out.update({"queue_s_mean": float(fin.mean()) if fin.size else float("nan"),
                    "queue_s_p50": q["p50"], "queue_s_p95": q["p95"], "queue_s_p99": q["p99"]})
        ws, skipped = window.select(st, float(self.requests["output_len"].mean()))
        nw = len(ws)
        out["n_steps"] = int(len(st))
        out["warmup_steps"], out["window_steps"] = int(skipped), int(nw)
        if "sum_distinct" in ws.columns and self.num_layers:
            per_layer = ws["sum_distinct"].to_numpy() / self.num_layers
            b = ws["batch"].to_numpy()
            out["distinct_per_layer_step"] = float(per_layer.mean()) if nw else float("nan")
            out["distinct_per_layer_tokenweighted"] = float((per_layer * b).sum() / max(b.sum(), 1))
        if "batch" in ws.columns:
            out["mean_batch"] = float(ws["batch"].mean()) if nw else float("nan")
        dur = ws["step_ms"].to_numpy()
        out["step_ms_mean"] = float(dur.mean()) if nw else float("nan")
        w = self.worker
        counts = np.bincount(w[w >= 0], minlength=self.n_workers) if w.size else np.zeros(1)
        out["worker_load_cv"] = float(counts.std() / max(counts.mean(), 1e-12))
        if {"max_load", "sum_load"} <= set(ws.columns):
            g = int(st["ranks"].iloc[0]) if "ranks" in st.columns and len(st) else self.n_workers
            mx, sm = ws["max_load"].to_numpy(np.float64), ws["sum_load"].to_numpy(np.float64)
            out["avg_imbalance"] = float((g * mx - sm).mean()) if nw else float("nan")
            idle = np.where(mx > 0, 1 - sm / (g * np.maximum(mx, 1)), 0.0)
            out["idle_fraction"] = float(np.average(idle, weights=dur)) if nw and dur.sum() > 0 else float("nan")
            if "min_load" in ws.columns:
                out["avg_max_minus_min"] = float((mx - ws["min_load"].to_numpy()).mean()) if nw else float("nan")
            if "n_active" in ws.columns:
                tokens = float(ws["n_active"].sum())
                out["throughput_tok_s"] = tokens / (dur.sum() / 1e3) if dur.sum() > 0 else float("nan")
                out["mean_active"] = float(ws["n_active"].mean()) if nw else 0.0
                out["mean_rank_load"] = float(sm.mean() / g) if nw else 0.0
        if "decision_ms" in st.columns:
            d = st["decision_ms"].to_numpy()
            ok = np.isfinite(d)
            dq = percentiles(d[ok], (50, 95, 99))
            out["decision_ms_p50"], out["decision_ms_p95"], out["decision_ms_p99"] = dq["p50"], dq["p95"], dq["p99"]
            if "n_routed" in st.columns:
                routed = st["n_routed"].to_numpy()
                per_req_us = d[ok & (routed > 0)] * 1e3 / routed[ok & (routed > 0)]
                out["decision_us_per_request_p50"] = float(np.median(per_req_us)) if per_req_us.size else float("nan")
        clash = sorted(set(out) & set(self.info))
        if clash:
            raise ValueError(f"info must not reuse metric names; {clash} would override computed figures")
        return {**{k: _plain(v) for k, v in out.items()}, **self.info}


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (every computed metric is a plain float, int or bool)."""
    return value.item() if isinstance(value, np.generic) else value


def _name(name: str, value: Any) -> Any:
    """``value`` if it can be a dict key or a column name (a string, usually), else a named ``ValueError``:
    a list or an array used to end in a bare ``TypeError: unhashable type``."""
    try:
        hash(value)
    except TypeError:
        raise ValueError(f"{name} must be a name (a string); got {type(value).__name__} {value!r:.60}") from None
    return value


def _names(name: str, values: Any) -> list[Any]:
    if isinstance(values, str) or not isinstance(values, Collection):
        raise ValueError(f"{name} must be a collection of names; got {type(values).__name__} {values!r:.60}")
    return [_name(f"{name} entries", v) for v in values]


def gain_vs_best(results: Mapping[str, Mapping[str, float]], method: str, baselines: Collection[str], *,
                 metric: str = "tpot_ms_p50", higher_is_better: bool = False) -> tuple[float, str]:
    """``(gain %, best baseline)``: how much ``method`` improves ``metric`` over the best of
    ``baselines`` (lower is better unless ``higher_is_better``). Positive = better than every baseline.

    ``results`` maps a name to its metrics dict or row (e.g. ``{name: SimResult.metrics()}``)."""
    if not isinstance(results, Mapping) or not all(isinstance(v, (Mapping, pd.Series)) for v in results.values()):
        raise ValueError(f"results must map each name to its metrics dict; got {type(results).__name__} "
                         f"{results!r:.60}")
    check_choice("method", _name("method", method), results)
    baselines = _names("baselines", baselines)
    _name("metric", metric)
    base = [b for b in baselines if b in results and b != method]
    if not base:
        raise ValueError(f"none of the baselines {sorted(map(str, baselines))} is in results ({sorted(map(str, results))})")
    lacking = [r for r in (method, *base) if metric not in results[r]]
    if lacking:  # a KeyError before
        raise ValueError(f"metric must be a key of every compared result; got {metric!r}, which "
                         f"{lacking[0]!r} lacks (it has {sorted(map(str, results[lacking[0]].keys()))})")
    vals = {b: float(results[b][metric]) for b in base}
    if higher_is_better:
        best = max(vals, key=vals.get)
        return 100.0 * (float(results[method][metric]) / vals[best] - 1.0), best
    best = min(vals, key=vals.get)
    return 100.0 * (1.0 - float(results[method][metric]) / vals[best]), best


def gains_table(df: pd.DataFrame, method: str, baselines: Collection[str], *, by: str | list[str] = "rate",
                metric: str = "tpot_ms_p50", name_col: str = "router", higher_is_better: bool = False) -> pd.DataFrame:
    """:func:`gain_vs_best` per group of a long table (one row per run, ``name_col`` the method)."""
    check_instance("df", df, pd.DataFrame, "a pandas DataFrame (one row per run)")
    _name("method", method)
    baselines = _names("baselines", baselines)
    columns = list(map(str, df.columns))
    keys = [by] if isinstance(by, str) else by
    if not isinstance(keys, list) or not keys:
        raise ValueError(f"by must be a column name or a non-empty list of them; got {by!r:.60}")
    for name, col in [("name_col", name_col), ("metric", metric)] + [("by", k) for k in keys]:
        check_choice(name, col, columns)  # a KeyError from pandas before
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


__all__ = ["REQUEST_COLUMNS", "REQUEST_SCOPES", "MeasurementWindow", "SimResult", "gain_vs_best", "gains_table"]
