"""ELDR experiments: rate sweep for every router, tau sweep, balanced vs vanilla K-means, signature
kinds, prefix cache on/off — and the side-by-side with the paper's published p50 TPOT table.

One :class:`ELDRSetup` holds what every run shares: the calibration split (signatures are fitted and
centroids computed on it), the replay pool (requests replay its expert traces), the cost model and
the packed expert bits. Every run returns a flat dict of measured metrics; sweeps return DataFrames.

**What "rate" means, everywhere in ELDR** (this module, notebook 01, ``moelab sweep eldr``, the bench): an
arrival rate in the paper's units, req/s offered to the paper's cluster of :data:`PAPER_DECODE_WORKERS` = 16
decode workers. A setup of ``K`` workers is offered ``rate * K / 16`` req/s (:func:`paper_rate_scale`, ``K``
taken from the setup), so a rate names the same load *per worker* at every ``K``. Every result row keeps
both: ``rate`` (paper units) and ``sim_rate`` (req/s actually simulated). No function here takes a scale
factor; the one place a simulated rate is given directly is :func:`moelab.eldr.poisson_requests`
(``sim_rate``). :func:`rate_for_load` gives the rate at a target load of the cluster's batch slots.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

import moelab.eldr.routing  # noqa: F401  registers ELDR's routers for build_router
from moelab._stats import interval_verdict, log_ratio_interval, t_half_width
from moelab._validate import check_choice, check_instance, check_int, check_real, rng_from
from moelab.costmodel import MODEL_SHAPES, DecodeStepModel
from moelab.datasets import load_eldr_results
from moelab.eldr.partition import spherical_kmeans
from moelab.eldr.prefix import ConversationWorkload, cache_signatures, conversation_arrivals
from moelab.eldr.signature import KINDS, SignatureBuilder, _check_pairs
from moelab.eldr.sim import (
    PAPER_DECODE_WORKERS,
    pack_expert_bits,
    paper_rate_scale,
    poisson_requests,
    simulate,
)
from moelab.eldr.workload import SyntheticConfig, SyntheticWorkload, distinct_reduction, generate
from moelab.routing import (
    Router,
    RouterCalibration,
    available_routers,
    make_router,
    router_class,
    router_names,
)
from moelab.sim import MeasurementWindow, SimResult, gain_vs_best, gains_table
from moelab.traces import ExpertTrace, RequestTrace

BASELINES = router_names("eldr_paper")  # the paper's four load balancers (tagged in the ROUTERS registry)
# the paper's baselines, the KV-load balancer, the domain oracle and ELDR (the rows of notebook 01's sweep)
SWEEP_ROUTERS = (*BASELINES, "least_kv", "domain_oracle", "eldr")
PAPER_RATES = (20, 40, 60, 80, 100)
#: the default no-regression sweep of issue 11: every paper rate at K = 8, 16 and 32 decode workers,
#: the per-worker load of the paper's 16-worker cluster held fixed (rate scaled by K/16)
DEFAULT_SWEEP_K = (8, 16, 32)


@dataclass
class ELDRSetup:
    """Shared state of a set of experiments (see :func:`prepare`)."""

    calib: ExpertTrace
    pool: ExpertTrace
    cost: DecodeStepModel
    n_workers: int
    n_pairs: int = 30000
    seed: int = 0
    bits: np.ndarray = field(default=None, repr=False)
    _builders: dict = field(default_factory=dict, repr=False)
    _centroids: dict = field(default_factory=dict, repr=False)

    @property
    def n_domains(self) -> int:
        """Distinct domains over the calibration and replay halves."""
        return len(set(self.pool.domains) | set(self.calib.domains))

    def builder(self, kind: str = "count_idf") -> SignatureBuilder:
        """The signature builder of ``kind``, fitted on the calibration half (cached)."""
        check_choice("kind", kind, KINDS)
        if kind not in self._builders:
            self._builders[kind] = SignatureBuilder(kind, n_pairs=self.n_pairs, seed=self.seed).fit(self.calib)
        return self._builders[kind]

    def signatures(self, kind: str = "count_idf") -> np.ndarray:
        """Pool signatures (full prefill counts; prefix caching is studied through the signature cache,
        :func:`prefix_cache_ablation`)."""
        return self.builder(kind).transform(self.pool)

    def centroids(self, kind: str = "count_idf", balanced: bool = True) -> np.ndarray:
        """One centroid per worker: (balanced) spherical K-means of the calibration signatures (cached)."""
        key = (kind, balanced)
        if key not in self._centroids:
            X = self.builder(kind).transform(self.calib)
            self._centroids[key] = spherical_kmeans(X, self.n_workers, balanced=balanced, seed=self.seed).centroids
        return self._centroids[key]


def prepare(
    trace: ExpertTrace,
    cost: DecodeStepModel,
    n_workers: int = 16,
    *,
    calib_frac: float = 0.5,
    n_pairs: int = 30000,
    seed: int = 0,
) -> ELDRSetup:
    """Split ``trace`` into a calibration part (signature fit, K-means) and a replay pool (seeded).

    Parameters
    ----------
    trace : ExpertTrace
        The expert trace to split (requests with their prefill counts and decode expert ids).
    cost : DecodeStepModel
        The step model runs are priced with, at the trace's geometry (layers, experts, top-k; checked).
    n_workers : int
        Decode workers K (>= 1): one centroid each; the calibration part needs at least ``max(2, K)``
        requests.
    calib_frac : float
        Share of the trace's requests in the calibration part, in (0, 1); the rest is the replay pool
        (which must not be empty).
    n_pairs : int
        Request pairs the signature builders' layer-mask search scores (:class:`SignatureBuilder`; 10..
        ``MAX_PAIRS``, the paper 30,000); more is slower and steadier.
    seed : int
        Seed of the split (a random permutation), and of the signature builders and K-means fitted later.

    Returns
    -------
    ELDRSetup
        ``calib`` and ``pool`` (sub-traces), ``cost``, ``n_workers``, ``n_pairs``, ``seed`` and the pool's
        packed expert bits; signature builders and centroids are fitted on ``calib`` when first asked.
    """
    n_workers = check_int("n_workers", n_workers, low=1)
    calib_frac = check_real("calib_frac", calib_frac, low=0, high=1, low_open=True, high_open=True)
    n_pairs = _check_pairs(n_pairs)  # refused here, not at the first signature fit
    g = trace.geometry
    cost.check_geometry(g.num_layers, g.num_experts, g.top_k)
    perm = rng_from(seed).permutation(trace.n_requests)
    n_cal = int(round(calib_frac * trace.n_requests))
    if n_cal < max(2, n_workers) or trace.n_requests - n_cal < 1:
        raise ValueError(f"trace too small: {trace.n_requests} requests give {n_cal} calibration requests for "
                         f"n_workers={n_workers} (need >= max(2, n_workers)) and a non-empty pool")
    cal, pool = np.sort(perm[:n_cal]), np.sort(perm[n_cal:])
    return ELDRSetup(trace.subset(cal), trace.subset(pool), cost, n_workers, n_pairs, seed,
                     pack_expert_bits(trace.subset(pool)))


def with_workers(setup: ELDRSetup, n_workers: int) -> ELDRSetup:
    """The same calibration split, pool and fitted signatures with ``n_workers`` decode workers
    (centroids are recomputed for the new K)."""
    n_workers = check_int("n_workers", n_workers, low=1, high=setup.calib.n_requests)
    return ELDRSetup(setup.calib, setup.pool, setup.cost, n_workers, setup.n_pairs, setup.seed, setup.bits,
                     setup._builders, {})


def synthetic_setup(
    n_trace: int = 2048,
    *,
    model: str = "qwen3-30b-a3b",
    n_workers: int = 16,
    n_pairs: int = 30000,
    seed: int = 0,
    **config: object,
) -> tuple[ELDRSetup, SyntheticWorkload]:
    """A realistic-scale SYNTHETIC workload at a named model geometry (``MODEL_SHAPES``), with the H200
    step model at the same geometry, split into calibration and replay halves."""
    cost = DecodeStepModel.h200(model)
    moe = cost.shape.moe
    cfg = SyntheticConfig(num_layers=cost.num_layers, num_experts=moe.num_experts, top_k=moe.top_k, model_name=model,
                          **config)
    wl = generate(n_trace, cfg, seed=seed)
    return prepare(wl.trace, cost, n_workers, n_pairs=n_pairs, seed=seed), wl


def rate_for_batch(setup: ELDRSetup, batch: int, output_len: int = 512) -> float:
    """Arrival rate, in ELDR's unit (req/s at 16 decode workers), at which each of the setup's workers runs
    about ``batch`` requests.

    Little's law with the cost model's step time at that batch, the distinct experts taken from random
    batches of the pool (what a locality-blind router would batch). Picks comparable operating points for
    models of very different speed.

    Parameters
    ----------
    setup : ELDRSetup
        The workload, cost model and ``K`` (:func:`prepare`).
    batch : int
        Running requests per worker (>= 1).
    output_len : int
        Decode tokens per request (>= 1), as the runs will use.

    Returns
    -------
    float
        ``rate`` in the paper's units; the setup's ``K`` workers are offered ``rate * K / 16`` req/s.
    """
    batch = check_int("batch", batch, low=1)
    output_len = check_int("output_len", output_len, low=1)
    rng = rng_from(setup.seed)
    pool = setup.pool
    ok = np.flatnonzero(pool.decode_lens > 0)
    reqs = rng.choice(ok, size=min(batch, ok.size), replace=ok.size < batch)
    sum_d = float(pool.distinct_experts(reqs, rng.integers(0, 1 << 20, size=reqs.size)).sum())
    kv = batch * (float(pool.prompt_lens.mean()) + output_len / 2)
    step_s = float(setup.cost.step_ms(batch, sum_d, kv)) / 1e3
    return PAPER_DECODE_WORKERS * batch / (output_len * step_s)


#: the range of :func:`rate_for_load`'s ``load`` (a fraction of the cluster's batch slots)
LOAD_RANGE = (0.01, 4.0)


def rate_for_load(setup: ELDRSetup, load: float, *, output_len: int = 512, slots: int = 256) -> float:
    """Arrival rate, in ELDR's unit (req/s at 16 decode workers), that offers ``load`` times the cluster's
    slot capacity: :func:`rate_for_batch` at ``batch = slots``, times ``load``.

    ``load`` is the *offered* load, ``load = lambda_w * S / slots``: ``lambda_w`` the arrival rate per
    worker (``rate / 16``) and ``S`` a request's service time at a full batch, ``output_len`` decode steps
    of the cost model's step time for ``slots`` running requests (their distinct experts taken from random
    pool batches, their KV the pool's mean prompt plus half the output). By Little's law it is the share
    of the slots a worker would hold in steady state if every step took a full batch's time. It is not
    what a run's ``metrics()["mean_batch"]`` reports:

    - a short run averages its fill-up from empty and its drain after the last arrival into the mean (on
      the bundled ``tiny-moe-heldout`` trace at ``load`` 0.5 and 256 slots, 300 requests give a mean batch
      of about 37, 3000 about 87);
    - even in steady state a worker holds fewer than ``load * slots`` requests, because a smaller batch
      steps faster than the full one the load is priced at (about 100 of 128 there).

    To measure the steady state, simulate many request lifetimes (thousands of requests) and skip the
    fill-up with a :class:`moelab.sim.MeasurementWindow`: ``res.metrics(window=MeasurementWindow(
    warmup_lifetimes=...))`` (``metrics()["warmup_steps"]`` says how many steps it skipped). In the
    decode-cluster simulator each row of ``res.steps`` is one worker's step, so one request lifetime is
    about ``K * output_len`` rows: ``warmup_lifetimes=2 * K`` skips two (the window takes at most 10, and
    skips at most half the steps; for more workers skip a share with ``warmup_frac``). The drain stays in
    the window (this simulator records no admissions); many requests make it a small part.

    A router only changes anything when each worker runs a batch of many requests: near idle (``load``
    close to 0) every worker runs one or two requests and every router makes the same batches, so ELDR
    can group nothing. Above 1 requests queue.

    Parameters
    ----------
    setup : ELDRSetup
        The workload, cost model and ``K`` (:func:`prepare`).
    load : float
        Offered load as a fraction of the slot capacity, in :data:`LOAD_RANGE` (0.01..4).
    output_len : int
        Decode tokens per request (>= 1), as the runs will use.
    slots : int
        Batch slots per worker (>= 1), as the runs will use (:func:`run_one`'s ``slots``).

    Returns
    -------
    float
        ``rate`` in the paper's units, for :func:`run_one` / :func:`rate_sweep`.
    """
    load = check_real("load", load, low=LOAD_RANGE[0], high=LOAD_RANGE[1])
    slots = check_int("slots", slots, low=1)
    return load * rate_for_batch(setup, slots, output_len)


def build_router(setup: ELDRSetup, name: str, *, tau: float = 0.1, kind: str = "count_idf", balanced: bool = True,
                 refit_window_s: float | None = None, seed: int = 0) -> Router:
    """A router by name, prepared on the setup's calibration half: its ``kind`` signatures with the
    setup's cached (balanced) K-means centroids (ELDR's, refitted online every ``refit_window_s`` when
    given) and the domain labels of both halves (the oracle counts them). ELDR's knobs go only to
    routers that take them."""
    needs = router_class(name).calibration_needs  # build only what the router will fit on
    calibration = RouterCalibration(
        n_workers=setup.n_workers, seed=setup.seed,
        signatures=setup.builder(kind).transform(setup.calib) if "signatures" in needs else None,
        centroids=setup.centroids(kind, balanced) if "signatures" in needs else None,
        domains=np.concatenate([setup.calib.domains, setup.pool.domains]) if "domains" in needs else None)
    return make_router(name, calibration, seed=seed,
                       options={"tau": tau, "balanced": balanced, "refit_window_s": refit_window_s})


def run_one(
    setup: ELDRSetup,
    router: str = "eldr",
    *,
    rate: float = 60.0,
    n_requests: int = 2000,
    output_len: int = 512,
    tau: float = 0.1,
    kind: str = "count_idf",
    balanced: bool = True,
    slots: int = 256,
    refit_window_s: float | None = None,
    seed: int = 0,
    window: MeasurementWindow | None = None,
    tail: bool = False,
) -> dict:
    """Simulate one configuration; returns the metrics plus the configuration.

    ``rate`` is in ELDR's unit, req/s at 16 decode workers: the setup's ``K`` workers are offered
    ``sim_rate = rate * K / 16`` req/s (:func:`paper_rate_scale`). The row keeps both.

    Parameters
    ----------
    setup : ELDRSetup
        The shared workload, signatures, centroids and cost model (:func:`prepare`).
    router : str
        A registered router name (:func:`moelab.routers.router_names`).
    rate : float
        Arrival rate (> 0) in req/s at 16 decode workers (e.g. :func:`rate_for_load`).
    n_requests, output_len : int
        Requests replayed, and decode tokens each.
    tau : float
        ELDR's band width (only routers that take it).
    kind : str
        Signature kind (:data:`moelab.eldr.signature.KINDS`).
    balanced : bool
        Balanced K-means centroids (ELDR).
    slots : int
        Batch slots per worker.
    refit_window_s : float, optional
        Refit ELDR's centroids online over this window.
    seed : int
        Seed of arrivals and routers.
    window : MeasurementWindow, optional
        The measurement window the metrics are taken over (:meth:`moelab.sim.SimResult.metrics`). Default
        None: the whole run, every request (as before). For steady-state figures pass e.g.
        ``MeasurementWindow(warmup_lifetimes=2 * K, requests="window")``: the step figures skip the
        fill-up and the TPOT/TTFT percentiles cover only the requests arriving inside the window (run many
        request lifetimes, thousands of requests, so enough of them remain).
    tail : bool
        Also report where the TPOT tail comes from (:func:`tail_batches`: ``peak_batch``, ``tail_batch``,
        ``rest_batch``, ``tail_worker_share``), over the whole run.

    Returns
    -------
    dict
        ``router``, ``rate``, ``sim_rate``, the configuration and :meth:`moelab.sim.SimResult.metrics`.
    """
    rate = check_real("rate", rate, low=0, low_open=True)
    if window is not None:
        check_instance("window", window, MeasurementWindow, "a moelab.sim.MeasurementWindow or None")
    sim_rate = rate * paper_rate_scale(setup.n_workers)
    r = build_router(setup, router, tau=tau, kind=kind, balanced=balanced, refit_window_s=refit_window_s, seed=seed)
    sig = setup.signatures(kind) if "signature" in r.requires else None
    reqs = poisson_requests(setup.pool, sim_rate=sim_rate, n_requests=n_requests, output_len=output_len, seed=seed)
    res = simulate(reqs, r, setup.cost, n_workers=setup.n_workers, trace=setup.pool, signatures=sig, slots=slots,
                   bits=setup.bits)
    return {"router": router, "rate": float(rate), "sim_rate": float(sim_rate), "tau": tau, "kind": kind, "balanced": balanced,
            "refit_window_s": refit_window_s, "n_workers": setup.n_workers,
            "n_refits": getattr(getattr(r, "refit", None), "n_refits", 0), **res.metrics(window=window),
            **(tail_batches(res) if tail else {})}


#: the share of the slowest requests (by TPOT) :func:`tail_batches` calls the tail: the p99's 1%
TAIL_PCT = 1.0
_STEP_TOL_S = 1e-9  # seconds: a step ending this close to a token's time produced it


def tail_batches(res: SimResult, tail_pct: float = TAIL_PCT) -> dict[str, float]:
    """Where a run's TPOT tail comes from: the batches its slowest requests decoded in.

    A request's *lifetime batch* is the mean batch of the steps that produced its tokens: its worker's steps
    from the one that ended at its first token (``first_token_s``) to the one that ended at its last
    (``finish_s``). A step's ``t_s`` is its start, so a step ends at ``t_s + step_ms``. (A step's time grows
    with its batch, so a request that decodes inside a crowded batch has a high TPOT.)

    Parameters
    ----------
    res : SimResult
        A decode-cluster run (:func:`moelab.eldr.sim.simulate`).
    tail_pct : float
        The slowest share of the requests (by TPOT, in %) that form the tail, in (0, 50].

    Returns
    -------
    dict
        ``peak_batch`` (the largest batch any worker ran), ``tail_batch`` and ``rest_batch`` (the mean
        lifetime batch of the tail's requests and of the others), ``tail_worker_share`` (the fraction of the
        tail's requests on the one worker that holds most of them) and ``tail_requests``.
    """
    tail_pct = check_real("tail_pct", tail_pct, low=0, high=50, low_open=True)
    q, st = res.requests, res.steps
    multi = (q["output_len"] > 1).to_numpy()
    q = q[multi]
    first, finish = q["first_token_s"].to_numpy(np.float64), q["finish_s"].to_numpy(np.float64)
    tpot = (finish - first) / (q["output_len"].to_numpy(np.float64) - 1)
    worker = q["worker"].to_numpy()
    life = np.full(len(q), np.nan)
    for w in np.unique(worker):
        s = st[st["worker"] == w].sort_values("t_s")
        # a step's t_s is its start (moelab.sim.cluster logs it when the step starts); its tokens exist at its end,
        # the same float the simulator computed (t + ms * 1e-3), so a request's steps are those whose END lies in
        # [first_token_s, finish_s] (a small tolerance keeps hand-built results exact too)
        end = s["t_s"].to_numpy(np.float64) + s["step_ms"].to_numpy(np.float64) * 1e-3
        b = np.concatenate([[0.0], np.cumsum(s["batch"].to_numpy(np.float64))])
        mine = np.flatnonzero(worker == w)
        lo = np.searchsorted(end, first[mine] - _STEP_TOL_S, "left")
        hi = np.searchsorted(end, finish[mine] + _STEP_TOL_S, "right")
        n = hi - lo
        with np.errstate(invalid="ignore", divide="ignore"):
            life[mine] = np.where(n > 0, (b[hi] - b[lo]) / np.maximum(n, 1), np.nan)
    cut = np.percentile(tpot, 100 - tail_pct)
    slow = tpot >= cut
    counts = np.bincount(worker[slow].astype(np.int64))
    return {"peak_batch": float(st["batch"].max()), "tail_batch": float(np.nanmean(life[slow])),
            "rest_batch": float(np.nanmean(life[~slow])) if (~slow).any() else float("nan"),
            "tail_worker_share": float(counts.max() / slow.sum()), "tail_requests": int(slow.sum())}


def rate_sweep(setup: ELDRSetup, rates: Sequence[float] = PAPER_RATES, routers: Sequence[str] = SWEEP_ROUTERS,
               **kw: Any) -> pd.DataFrame:
    """Every router at every rate (same arrivals per rate for every router).

    Parameters
    ----------
    setup : ELDRSetup
        The shared workload, signatures, centroids and cost model (:func:`prepare`).
    rates : sequence of float
        Arrival rates in ELDR's unit, req/s at 16 decode workers: the setup's ``K`` workers are offered
        ``rate * K / 16`` (default :data:`PAPER_RATES`, the paper's).
    routers : sequence of str
        Registered router names (default :data:`SWEEP_ROUTERS`).
    **kw
        Passed to :func:`run_one` (``n_requests``, ``output_len``, ``tau``, ``slots``, ``seed``, ``window``
        for steady-state figures, ...).

    Returns
    -------
    DataFrame
        One :func:`run_one` row per (rate, router): ``rate`` (paper units), ``sim_rate`` (simulated) and the
        metrics.
    """
    for name in routers:
        if name not in available_routers():
            raise ValueError(f"router must be one of {available_routers()}; got {name!r}")
    return pd.DataFrame([run_one(setup, name, rate=rate, **kw) for rate in rates for name in routers])


#: how many seeds :func:`seed_spread` and :func:`ablation_spread` run by default (the setup's seed and the next
#: ones); each seed redraws a run's randomness (see :func:`seed_spread`)
ELDR_SPREAD_SEEDS = 5
#: the confidence level of :func:`gain_interval`'s interval (of the whole family in :func:`ablation_spread`)
SPREAD_LEVEL = 0.95


def gain_interval(reference_ms: Sequence[float], method_ms: Sequence[float], *,
                  level: float = SPREAD_LEVEL, n_comparisons: int = 1) -> dict[str, Any]:
    """The relative gain of a method over a reference, paired by seed, with a Student-t interval.

    One estimator gives the point and the interval: the mean over seeds of ``log(method / reference)``. The gain
    is ``100 * (1 - exp(mean))``, which equals ``100 * (1 - method_geomean / reference_geomean)`` (the geometric
    means over the seeds, so the two reproduce it by hand), and its interval is the t-interval of the mean log,
    mapped the same way (the gain always lies inside it).

    Parameters
    ----------
    reference_ms, method_ms : sequence of float
        One value per seed (same seeds, same order, same requests per seed: equal budgets), lower is better,
        finite and > 0.
    level : float
        Confidence level of the interval, in (0, 1) (of the whole family when ``n_comparisons`` > 1).
    n_comparisons : int
        How many intervals are read together (Bonferroni: each is at level ``1 - (1 - level) / n_comparisons``).

    Returns
    -------
    dict
        ``gains_pct`` (per seed, ``100 * (1 - method / reference)``), ``reference_geomean_ms`` and
        ``method_geomean_ms``, ``gain_pct``, ``gain_lo_pct`` and ``gain_hi_pct`` (the interval), ``n_seeds`` and
        ``verdict`` (the interval against 0): ``"ahead"`` when the whole
        interval is above zero, ``"behind"`` when it is below, else ``"not distinguishable"``.
    """
    r = log_ratio_interval(reference_ms, method_ms, level=level, n_comparisons=n_comparisons,
                           reference_name="reference_ms", method_name="method_ms")
    ref = np.asarray(reference_ms, dtype=np.float64)
    met = np.asarray(method_ms, dtype=np.float64)
    lo, hi = 100 * (1 - r["ratio_hi"]), 100 * (1 - r["ratio_lo"])
    return {"gains_pct": (100 * (1 - met / ref)).tolist(), "reference_geomean_ms": r["reference_geomean"],
            "method_geomean_ms": r["method_geomean"], "gain_pct": 100 * (1 - r["ratio"]), "gain_lo_pct": lo,
            "gain_hi_pct": hi, "n_seeds": r["n"], "verdict": interval_verdict(lo, hi, null=0.0)}


def _spread_seeds(setup: ELDRSetup, seeds: Sequence[int] | None) -> list[int]:
    out = [setup.seed + i for i in range(ELDR_SPREAD_SEEDS)] if seeds is None else [int(x) for x in seeds]
    if len(out) < 2 or len(set(out)) != len(out):
        raise ValueError(f"seeds must be at least 2 distinct seeds; got {out}")
    return out


def seed_spread(setup: ELDRSetup, rates: Sequence[float] = PAPER_RATES, *, seeds: Sequence[int] | None = None,
                baselines: Sequence[str] = BASELINES, **kw: Any) -> pd.DataFrame:
    """ELDR's p50 TPOT gain over the best baseline at each rate, over several seeds at equal budgets.

    A seed redraws everything random in a run, from one stream (:func:`moelab._validate.rng_from`): the Poisson
    arrival gaps, which requests of the replay pool arrive (drawn with replacement) and where in their decode
    they start, and the routers' random choices (tie-breaks, random and P2C picks). The workload, signatures and
    centroids stay the setup's. At a seed every router gets the same requests at the same times. The best
    baseline is chosen **per seed**: the lowest p50 of ``baselines`` at that seed (the reference a deployment
    would have had to beat on that draw), so nothing is chosen on the seeds' mean and then tested on them.

    Parameters
    ----------
    setup : ELDRSetup
        The shared workload, signatures, centroids and cost model (:func:`prepare`).
    rates : sequence of float
        Arrival rates in ELDR's unit (req/s at 16 decode workers), at least one.
    seeds : sequence of int, optional
        Seeds, at least 2 distinct (default: :data:`ELDR_SPREAD_SEEDS` seeds from the setup's seed on).
    baselines : sequence of str
        The load balancers ELDR is compared with (default the paper's four).
    **kw
        Passed to :func:`run_one` (``n_requests``, ``output_len``, ``tau``, ...; not ``seed`` or ``rate``).

    Returns
    -------
    DataFrame
        One row per rate: ``rate``, ``best_baseline`` (the per-seed best, with how many seeds each was best at when
        they differ), ``best_baselines`` (per seed), ``baseline_tpot_ms_p50`` and ``eldr_tpot_ms_p50`` (geometric
        means over the seeds of the per-seed best baseline's p50 and of ELDR's: ``gain_pct`` is exactly
        ``100 * (1 - eldr / baseline)`` of these two), ``eldr_p50_spread_pct`` (half-width of the interval of
        ELDR's own p50, relative to its mean: the seed-to-seed noise of one run), :func:`gain_interval`'s
        figures, and the same for the p99 TPOT from the same runs, prefixed ``p99_`` (``p99_gain_pct``,
        ``p99_gain_lo_pct``, ``p99_gain_hi_pct``, ``p99_verdict``, ``p99_reference_geomean_ms``,
        ``p99_method_geomean_ms``; its best baseline is the lowest p99 at each seed).
    """
    seeds = _spread_seeds(setup, seeds)
    rates = list(rates)
    if not rates:
        raise ValueError("rates must name at least one arrival rate")
    if not baselines:
        raise ValueError("baselines must name at least one router")
    for key in ("seed", "rate"):
        if key in kw:
            raise ValueError(f"seed_spread sets {key!r} itself; do not pass it")
    rows = []
    for rate in rates:
        runs = {name: [run_one(setup, name, rate=rate, seed=s, **kw) for s in seeds] for name in (*baselines, "eldr")}
        p50 = {name: np.array([m["tpot_ms_p50"] for m in ms]) for name, ms in runs.items()}
        p99 = np.vstack([[m["tpot_ms_p99"] for m in runs[b]] for b in baselines])
        g99 = gain_interval(p99.min(axis=0), [m["tpot_ms_p99"] for m in runs["eldr"]])
        base = np.vstack([p50[b] for b in baselines])
        best_idx = base.argmin(axis=0)
        best_names = [baselines[i] for i in best_idx]
        counts = pd.Series(best_names).value_counts()
        best = str(counts.index[0]) if len(counts) == 1 else ", ".join(
            f"{name} {n}/{len(seeds)}" for name, n in counts.items())
        e = p50["eldr"]
        half = t_half_width(e, SPREAD_LEVEL)
        g = gain_interval(base.min(axis=0), e)
        rows.append({"rate": float(rate), "best_baseline": best, "best_baselines": best_names,
                     "baseline_tpot_ms_p50": g["reference_geomean_ms"], "eldr_tpot_ms_p50": g["method_geomean_ms"],
                     "eldr_p50_spread_pct": 100 * half / float(e.mean()), **g,
                     **{f"p99_{k}": g99[k] for k in ("reference_geomean_ms", "method_geomean_ms", "gain_pct",
                                                     "gain_lo_pct", "gain_hi_pct", "verdict")}})
    return pd.DataFrame(rows)


def ablation_effect(df: pd.DataFrame, knob: str) -> dict[str, Any]:
    """What one ablation table shows: the fastest and the slowest setting of ``knob`` by p50 TPOT, how far
    apart they are, and what moved with it (distinct experts per layer and step, the request-count CV).

    Parameters
    ----------
    df : DataFrame
        One :func:`run_one` row per setting (an ablation: :func:`tau_sweep`, :func:`kmeans_ablation`, ...);
        rows without a p50 (skipped settings) are left out.
    knob : str
        The column that names the setting.

    Returns
    -------
    dict
        ``knob``, ``settings`` (as strings, table order), ``fastest`` / ``slowest`` (the settings),
        ``fastest_p50`` / ``slowest_p50`` (ms), ``spread_pct`` (slowest over fastest, %), and the same two
        settings' ``*_distinct``, ``*_cv`` and ``*_p99``.
    """
    if knob not in df.columns:
        raise ValueError(f"knob must be a column of the table; got {knob!r}")
    d = df[df["tpot_ms_p50"].notna()] if "tpot_ms_p50" in df else df.iloc[0:0]
    if len(d) < 2:
        raise ValueError("an ablation needs at least two settings with a p50 TPOT")
    fast, slow = d.loc[d["tpot_ms_p50"].idxmin()], d.loc[d["tpot_ms_p50"].idxmax()]
    return {"knob": knob, "settings": [str(v) for v in d[knob]], "fastest": str(fast[knob]), "slowest": str(slow[knob]),
            "fastest_p50": float(fast["tpot_ms_p50"]), "slowest_p50": float(slow["tpot_ms_p50"]),
            "spread_pct": 100 * (float(slow["tpot_ms_p50"]) / float(fast["tpot_ms_p50"]) - 1),
            "fastest_distinct": float(fast["distinct_per_layer_step"]), "slowest_distinct": float(slow["distinct_per_layer_step"]),
            "fastest_cv": float(fast["worker_load_cv"]), "slowest_cv": float(slow["worker_load_cv"]),
            "fastest_p99": float(fast["tpot_ms_p99"]), "slowest_p99": float(slow["tpot_ms_p99"])}


#: what :func:`ablation_spread` says of a setting against the reference, from the interval of its p50 change
_CHANGE_WORDS = {"ahead": "slower", "behind": "faster", "not distinguishable": "not distinguishable"}


def ablation_spread(ablation: Any, setup: ELDRSetup, knob: str, *, reference: Any, seeds: Sequence[int] | None = None,
                    **kw: Any) -> dict[str, Any]:
    """An ablation over several seeds: each setting against one **pre-named** reference setting.

    The reference is named before the runs (the notebook's own setting: its tau, balanced K-means, count_idf,
    offline centroids), so nothing is chosen from the results and then tested on them. Each other setting's p50
    TPOT is compared with the reference's, paired by seed (:func:`gain_interval`'s estimator: geometric means,
    a t-interval of the mean log ratio), and the intervals are Bonferroni-corrected over the comparisons: all of
    them hold together with probability :data:`SPREAD_LEVEL`.

    Parameters
    ----------
    ablation : callable
        An ablation of this module (:func:`tau_sweep`, :func:`kmeans_ablation`, :func:`signature_ablation`,
        :func:`refit_ablation`), called as ``ablation(setup, seed=s, **kw)`` once per seed.
    setup : ELDRSetup
        The shared workload (:func:`prepare`).
    knob : str
        The column that names the setting.
    reference : object
        The setting the others are compared with: a value of the ``knob`` column (e.g. ``0.1``, ``True``).
    seeds : sequence of int, optional
        At least 2 distinct seeds (default: :data:`ELDR_SPREAD_SEEDS` from the setup's seed on).
    **kw
        Passed to ``ablation`` (``rate``, ``n_requests``, ``tau``, ...; not ``seed``).

    Returns
    -------
    dict
        ``knob``, ``settings`` (as strings, table order), ``reference`` (as a string), ``reference_p50`` (geometric
        mean over the seeds, ms), ``reference_distinct`` / ``reference_cv`` / ``reference_p99`` (the first seed's
        table), ``n_seeds``, ``n_comparisons``, ``level`` (of the family), ``comparisons`` (one dict per other
        setting: ``setting``, ``p50`` (geometric mean, ms), ``change_pct`` (its p50 above the reference's, %:
        ``100 * (p50 / reference_p50 - 1)``), ``change_lo_pct`` / ``change_hi_pct`` (the corrected interval),
        ``verdict`` (``"slower"``, ``"faster"`` or ``"not distinguishable"``), and the first seed's ``distinct``,
        ``cv`` and ``p99``) and ``table`` (the first seed's table).
    """
    if "seed" in kw:
        raise ValueError("ablation_spread runs one table per seed: pass seeds, not seed")
    seeds = _spread_seeds(setup, seeds)
    tables = [ablation(setup, seed=s, **kw) for s in seeds]
    first = tables[0]
    if knob not in first.columns:
        raise ValueError(f"knob must be a column of the ablation's table {list(first.columns)}; got {knob!r}")
    matches = [str(v) for v in first[knob] if v == reference]
    if not matches:
        raise ValueError(f"reference must be one of the {knob} settings {[str(v) for v in first[knob]]}; got {reference!r}")
    ref = matches[0]
    p50 = pd.DataFrame({s: t.set_index(t[knob].astype(str))["tpot_ms_p50"] for s, t in zip(seeds, tables)}).dropna()
    if ref not in p50.index:
        raise ValueError(f"the reference setting {knob} = {ref} has no p50 TPOT (skipped)")
    others = [str(v) for v in p50.index if str(v) != ref]
    if not others:
        raise ValueError("an ablation needs at least two settings with a p50 TPOT")
    row = first.assign(**{knob: first[knob].astype(str)}).set_index(knob)
    comparisons = []
    for name in others:
        r = log_ratio_interval(p50.loc[ref].to_numpy(), p50.loc[name].to_numpy(), level=SPREAD_LEVEL,
                               n_comparisons=len(others), reference_name=f"{knob} = {ref}", method_name=f"{knob} = {name}")
        lo, hi = 100 * (r["ratio_lo"] - 1), 100 * (r["ratio_hi"] - 1)
        comparisons.append({"setting": name, "p50": r["method_geomean"], "change_pct": 100 * (r["ratio"] - 1),
                            "change_lo_pct": lo, "change_hi_pct": hi,
                            "verdict": _CHANGE_WORDS[interval_verdict(lo, hi, null=0.0)],
                            "distinct": float(row.loc[name, "distinct_per_layer_step"]),
                            "cv": float(row.loc[name, "worker_load_cv"]), "p99": float(row.loc[name, "tpot_ms_p99"])})
    ref_geo = float(np.exp(np.log(p50.loc[ref].to_numpy(np.float64)).mean()))
    return {"knob": knob, "settings": [str(v) for v in first[knob]], "reference": ref, "reference_p50": ref_geo,
            "reference_distinct": float(row.loc[ref, "distinct_per_layer_step"]),
            "reference_cv": float(row.loc[ref, "worker_load_cv"]), "reference_p99": float(row.loc[ref, "tpot_ms_p99"]),
            "n_seeds": len(seeds), "n_comparisons": len(others), "level": SPREAD_LEVEL, "comparisons": comparisons,
            "table": first}


def gains(df: pd.DataFrame, baselines: Sequence[str] = BASELINES) -> pd.DataFrame:
    """Per rate: best baseline's p50 TPOT, ELDR's, ELDR's relative gain (%), and the distinct experts
    per layer per step of both (the cause) with ELDR's relative reduction (%)."""
    t = gains_table(df, "eldr", baselines, by="rate")
    t2 = gains_table(df, "eldr", baselines, by="rate", metric="distinct_per_layer_step")
    if t.empty:
        return pd.DataFrame()
    best = t["best_baseline"].tolist()
    base_d = [df[(df["rate"] == r) & (df["router"] == b)]["distinct_per_layer_step"].iloc[0] for r, b in zip(t["rate"], best)]
    eldr_d = t2["eldr_distinct_per_layer_step"].to_numpy()
    return pd.DataFrame({"rate": t["rate"], "best_baseline": best, "baseline_tpot_ms_p50": t["baseline_tpot_ms_p50"],
                         "eldr_tpot_ms_p50": t["eldr_tpot_ms_p50"], "tpot_gain_pct": t["gain_pct"],
                         "baseline_distinct": base_d, "eldr_distinct": eldr_d,
                         "distinct_reduction_pct": 100 * (1 - eldr_d / np.asarray(base_d, dtype=float))})


def paper_gains(model: str = "qwen3-30b-a3b") -> pd.DataFrame:
    """The paper's published p50 TPOT (``load_eldr_results``): best of rr/random/jsq/p2c vs ELDR per rate."""
    t = load_eldr_results()
    models = sorted(t["model"].unique())
    check_choice("model", model, models)
    t = t[t["model"] == model]
    best = t[["rr", "random", "jsq", "p2c"]].min(axis=1)
    return pd.DataFrame({"rate": t["rate_rps"].to_numpy(float), "paper_baseline_tpot_ms_p50": best.to_numpy(),
                         "paper_eldr_tpot_ms_p50": t["eldr"].to_numpy(),
                         "paper_gain_pct": (100 * (1 - t["eldr"] / best)).to_numpy()})


def gain_budget(df: pd.DataFrame, setup: ELDRSetup, model: str = "qwen3-30b-a3b") -> pd.DataFrame:
    """Per rate: how much TPOT gain ELDR's distinct-expert reduction can buy, and how full the paper's batches were.

    A step's time is a fixed part plus a cost per distinct expert-layer read (:meth:`DecodeStepModel.coefficients`
    at the best baseline's mean batch). ``expert_share_pct`` is the part of the best baseline's p50 TPOT spent
    reading its distinct experts (``distinct x layers x cost per expert``); ``direct_gain_pct`` is ELDR's
    distinct-expert reduction times that share: the TPOT gain fewer experts give directly at the same batch,
    before uneven load costs some of it or shorter steps (fewer requests in flight) add to it. ``paper_tpot_ratio`` is the paper's best-baseline p50 TPOT over ours at the same rate; at the
    same load per worker and output length, the requests in flight per worker grow with the TPOT (Little's
    law: in flight = arrival rate x output tokens x TPOT), so ``paper_batch_estimate`` (our best baseline's mean
    batch times that ratio) estimates the paper's batch. Rates the paper did not run are left out.

    Parameters
    ----------
    df : DataFrame
        A :func:`rate_sweep` on ``setup`` (with the baselines and ``eldr``).
    setup : ELDRSetup
        The setup the sweep ran on (its cost model and number of MoE layers).
    model : str
        The paper's model whose published TPOT is compared (:func:`paper_gains`).

    Returns
    -------
    DataFrame
        One row per rate: ``rate``, ``best_baseline``, ``baseline_mean_batch``, ``eldr_mean_batch``,
        ``distinct_reduction_pct``, ``expert_share_pct``, ``direct_gain_pct``, ``tpot_gain_pct``,
        ``paper_gain_pct``, ``paper_tpot_ratio`` and ``paper_batch_estimate``.
    """
    g = gains(df).merge(paper_gains(model), on="rate", how="inner")
    layers = setup.pool.geometry.num_layers
    rows = []
    for r in g.to_dict("records"):
        at = df[df["rate"] == r["rate"]].set_index("router")
        batch = float(at.loc[r["best_baseline"], "mean_batch"])
        per_expert_ms = setup.cost.coefficients(batch)[1]
        share = 100 * per_expert_ms * layers * float(r["baseline_distinct"]) / float(r["baseline_tpot_ms_p50"])
        ratio = float(r["paper_baseline_tpot_ms_p50"]) / float(r["baseline_tpot_ms_p50"])
        rows.append({"rate": float(r["rate"]), "best_baseline": r["best_baseline"], "baseline_mean_batch": batch,
                     "eldr_mean_batch": float(at.loc["eldr", "mean_batch"]),
                     "distinct_reduction_pct": float(r["distinct_reduction_pct"]), "expert_share_pct": share,
                     "direct_gain_pct": float(r["distinct_reduction_pct"]) * share / 100,
                     "tpot_gain_pct": float(r["tpot_gain_pct"]), "paper_gain_pct": float(r["paper_gain_pct"]),
                     "paper_tpot_ratio": ratio, "paper_batch_estimate": batch * ratio})
    return pd.DataFrame(rows)


def compare_with_paper(df: pd.DataFrame, model: str = "qwen3-30b-a3b", real: pd.DataFrame | None = None) -> pd.DataFrame:
    """Two-sided, per rate: the paper's p50 TPOT gain, ours (``df``: the calibrated synthetic workload)
    and, when given, ours on a real trace (``real``: a rate sweep on it), with ``ours / paper`` ratios
    (> 1 is an overshoot, a finding to explain, not a pass). Rates we did not run are left out."""
    out = gains(df).merge(paper_gains(model), on="rate", how="inner")
    out["ratio_synthetic"] = out["tpot_gain_pct"] / out["paper_gain_pct"]
    if real is not None:
        g = gains(real)[["rate", "tpot_gain_pct", "distinct_reduction_pct"]].rename(
            columns={"tpot_gain_pct": "real_tpot_gain_pct", "distinct_reduction_pct": "real_distinct_reduction_pct"})
        out = out.merge(g, on="rate", how="left")
        out["ratio_real"] = out["real_tpot_gain_pct"] / out["paper_gain_pct"]
    return out


def paper_peak_rate(model: str = "qwen3-30b-a3b") -> float:
    """The arrival rate at which the paper's published p50 TPOT gain peaks (read from ``eldr-results``)."""
    p = paper_gains(model)
    return float(p.loc[p["paper_gain_pct"].idxmax(), "rate"])


def default_sweep(setup: ELDRSetup, *, rates: Sequence[float] = PAPER_RATES, ks: Sequence[int] = DEFAULT_SWEEP_K,
                  routers: Sequence[str] = (*BASELINES, "eldr"), **kw: Any) -> pd.DataFrame:
    """The no-regression sweep: every router at every rate for every K in ``ks`` (rates in ELDR's unit, so
    each K sees the paper's 16-worker per-worker load). One row per run."""
    rows = []
    for k in ks:
        s = setup if k == setup.n_workers else with_workers(setup, k)
        rows.extend(run_one(s, r, rate=rate, **kw) for rate in rates for r in routers)
    return pd.DataFrame(rows)


def sweep_gains(df: pd.DataFrame, baselines: Sequence[str] = BASELINES) -> pd.DataFrame:
    """Per (K, rate): ELDR's p50 and p99 TPOT gain (%) over the best baseline of each metric."""
    p50 = gains_table(df, "eldr", baselines, by=["n_workers", "rate"], metric="tpot_ms_p50")
    p99 = gains_table(df, "eldr", baselines, by=["n_workers", "rate"], metric="tpot_ms_p99")
    return pd.DataFrame({"n_workers": p50["n_workers"], "rate": p50["rate"], "best_baseline_p50": p50["best_baseline"],
                         "p50_gain_pct": p50["gain_pct"], "best_baseline_p99": p99["best_baseline"],
                         "p99_gain_pct": p99["gain_pct"]})


def projection_cost(trace: ExpertTrace, like: str = "qwen3-30b-a3b", *,
                    calibration: str | os.PathLike = "h200") -> DecodeStepModel:
    """A PROJECTION step model: the trace's routing geometry with ``like``'s sizes, priced on a GPU's tables.

    Parameters
    ----------
    trace : ExpertTrace
        Gives the routing geometry (MoE layers, experts, top-k).
    like : str
        A :data:`moelab.costmodel.MODEL_SHAPES` name whose expert, attention and head sizes are used
        (default Qwen3-30B-A3B).
    calibration : str or path
        Whose step costs: a bundled GPU's name (default ``"h200"``, the measured H200 tables) or a folder
        ``moelab calibrate --out DIR`` wrote on your own GPU.

    Returns
    -------
    DecodeStepModel
    """
    if like not in MODEL_SHAPES:
        raise ValueError(f"like must be one of {sorted(MODEL_SHAPES)}; got {like!r}")
    g = trace.geometry
    shape = MODEL_SHAPES[like].with_(num_layers=g.num_layers, num_experts=g.num_experts, top_k=g.top_k,
                                     first_dense_layers=0, source=f"projection: {g.model_name} routing, {like} sizes")
    if isinstance(calibration, str) and calibration == "h200":
        return DecodeStepModel.h200(shape)  # the shared, cached H200 fit
    return DecodeStepModel.from_calibration(calibration, shape)


def adjusted_rand_index(a: np.ndarray, b: np.ndarray) -> float:
    """Adjusted Rand index of two labelings (Hubert & Arabie 1985), from the contingency table."""
    a = np.unique(np.asarray(a), return_inverse=True)[1]
    b = np.unique(np.asarray(b), return_inverse=True)[1]
    if a.shape != b.shape or a.size < 2:
        raise ValueError("labelings must have the same length >= 2")
    M = np.zeros((a.max() + 1, b.max() + 1), np.int64)
    np.add.at(M, (a, b), 1)

    def c2(x: np.ndarray) -> float:
        return float((x * (x - 1) / 2).sum())

    idx, ra, rb, tot = c2(M), c2(M.sum(1)), c2(M.sum(0)), a.size * (a.size - 1) / 2
    exp = ra * rb / tot
    den = 0.5 * (ra + rb) - exp
    return 1.0 if den == 0 else (idx - exp) / den


def real_setup(trace: ExpertTrace, *, n_workers: int = 16, n_pairs: int = 10000, like: str = "qwen3-30b-a3b",
               seed: int = 0) -> ELDRSetup:
    """The setup :func:`real_trace_report` runs a real trace on: :func:`prepare` with the PROJECTION cost
    (:func:`projection_cost`), the same split for the same arguments (e.g. for :func:`seed_spread`)."""
    return prepare(trace, projection_cost(trace, like), n_workers, n_pairs=n_pairs, seed=seed)


#: what each statistic of :func:`real_trace_report` means, in the words a table shows beside it
REAL_TRACE_STATISTICS: dict[str, str] = {
    "trace": "model whose router produced the trace",
    "n_requests": "requests in the trace",
    "n_tasks": "task categories (labels) in the trace",
    "smallest_task_requests": "requests in the smallest task category",
    "rho": "held-out count_idf Spearman rho, prefill signature distance vs decode-expert distance",
    "recall": "held-out decode-expert recall of the signature",
    "layers_kept": "MoE layers the greedy layer selection keeps in the signature",
    "distinct_reduction_pct": "fewer distinct experts per step, one task's batch vs a mixed batch (%)",
    "reduction_batch": "batch size B of that comparison: min(32, requests in the smallest task category)",
    "kmeans_ari": "adjusted Rand index, K-means clusters (one per task) vs the task labels",
    "n_workers": "decode workers simulated",
    "rate_scale": "simulated req/s per paper req/s: n_workers / 16 (the same load per worker)",
    "cost": "step-cost model of the rate sweep",
}


def real_trace_report(trace: ExpertTrace, *, n_workers: int = 16, rates: Sequence[float] = PAPER_RATES,
                      n_requests: int = 2000, output_len: int = 512, n_pairs: int = 10000, like: str = "qwen3-30b-a3b",
                      seed: int = 0, routers: Sequence[str] = SWEEP_ROUTERS,
                      setup: ELDRSetup | None = None) -> tuple[dict, pd.DataFrame]:
    """ELDR end to end on any real :class:`ExpertTrace`: held-out count_idf rho and decode-expert
    recall, same-task distinct-expert reduction (B = min(32, smallest task)), K-means (one cluster per
    task) vs task labels ARI, and the decode-cluster rate sweep of every router with the PROJECTION
    cost (:func:`projection_cost`: real routing, measured H200 kernel costs of ``like``-sized experts).

    ``rates`` are in ELDR's unit (req/s at 16 decode workers): ``n_workers`` workers are offered
    ``rate * n_workers / 16`` (:func:`paper_rate_scale`), the same per-worker load as the synthetic sweeps
    at the same rate.

    ``setup``, when given, is the :func:`real_setup` of ``trace`` with these ``n_workers``, ``n_pairs``,
    ``like`` and ``seed`` (built once and shared, e.g. with :func:`seed_spread`; checked); by default it is built
    here.

    Returns
    -------
    stats : dict
        The trace's locality statistics and the cost model's source, keyed as :data:`REAL_TRACE_STATISTICS`
        (which says what each means).
    sweep : DataFrame
        :func:`rate_sweep` rows (``rate`` in paper units, ``sim_rate`` simulated).
    """
    if setup is None:
        setup = real_setup(trace, n_workers=n_workers, n_pairs=n_pairs, like=like, seed=seed)
    else:
        check_instance("setup", setup, ELDRSetup, "an ELDRSetup (real_setup of the trace) or None")
        got = {"n_workers": setup.n_workers, "n_pairs": setup.n_pairs, "seed": setup.seed,
               "requests": setup.calib.n_requests + setup.pool.n_requests}
        want = {"n_workers": n_workers, "n_pairs": n_pairs, "seed": seed, "requests": trace.n_requests}
        if got != want or like not in setup.cost.shape.source:
            raise ValueError(f"setup must be real_setup(trace, n_workers={n_workers}, n_pairs={n_pairs}, like={like!r}, "
                             f"seed={seed}); got one with {got} and cost {setup.cost.shape.source!r}")
    cost = setup.cost
    rep = setup.builder("count_idf").report(setup.pool, n_pairs=n_pairs)
    codes, names = trace.domain_codes()
    smallest = int(np.bincount(codes).min())
    red = distinct_reduction(trace, batch=max(2, min(32, smallest)), seed=seed)
    X = setup.builder("count_idf").transform(trace)
    km = spherical_kmeans(X, len(names), balanced=False, seed=seed)
    df = rate_sweep(setup, rates=rates, routers=routers, n_requests=n_requests, output_len=output_len, seed=seed)
    stats = {"trace": trace.geometry.model_name, "n_requests": trace.n_requests, "n_tasks": len(names),
             "smallest_task_requests": smallest, "rho": rep["rho"], "recall": rep["recall"], "layers_kept": rep["layers_kept"],
             "distinct_reduction_pct": red["reduction_pct"], "reduction_batch": red["batch"],
             "kmeans_ari": adjusted_rand_index(km.labels, codes), "n_workers": n_workers,
             "rate_scale": paper_rate_scale(n_workers),
             "cost": cost.shape.source}
    return stats, df


def tau_sweep(setup: ELDRSetup, taus: Sequence[float] = (0.0, 0.05, 0.1, 0.2, 0.3, 2.0), *, rate: float = 60.0,
              **kw: Any) -> pd.DataFrame:
    """ELDR at each band width tau (tau=2 is plain JSQ)."""
    for t in taus:
        check_real("tau", t, low=0)
    return pd.DataFrame([run_one(setup, "eldr", rate=rate, tau=t, **kw) for t in taus])


def kmeans_ablation(setup: ELDRSetup, *, rate: float = 60.0, **kw) -> pd.DataFrame:
    """Balanced vs vanilla (unconstrained) spherical K-means centroids."""
    return pd.DataFrame([run_one(setup, "eldr", rate=rate, balanced=b, **kw) for b in (True, False)])


def refit_ablation(setup: ELDRSetup, *, rate: float = 60.0, window_s: float = 5.0, **kw) -> pd.DataFrame:
    """Offline centroids only vs online refits every ``window_s`` on the last ``window_s`` of signatures."""
    rows = [{**run_one(setup, "eldr", rate=rate, **kw), "refit": "offline only"},
            {**run_one(setup, "eldr", rate=rate, refit_window_s=window_s, **kw), "refit": f"online ({window_s:g} s window)"}]
    return pd.DataFrame(rows)


def signature_ablation(setup: ELDRSetup, kinds: Sequence[str] = KINDS, *, rate: float = 60.0, **kw: Any) -> pd.DataFrame:
    """ELDR with each signature kind (kinds the trace cannot provide, e.g. gate_prob without
    ``prefill_probs``, are reported as skipped rather than silently dropped), with each kind's held-out
    ``signature_rho`` (against raw decode profiles) and ``signature_rho_idf_decode`` (against idf-weighted ones;
    :meth:`~moelab.eldr.signature.SignatureBuilder.report`), its ``layers_kept`` and its run's metrics."""
    rows = []
    for kind in kinds:
        if kind == "gate_prob" and setup.pool.prefill_probs is None:
            rows.append({"router": "eldr", "kind": kind, "skipped": "trace has no prefill_probs"})
            continue
        rep = setup.builder(kind).report(setup.pool, n_pairs=min(setup.n_pairs, 10000))
        rows.append({**run_one(setup, "eldr", rate=rate, kind=kind, **kw), "signature_rho": rep["rho"],
                     "signature_rho_idf_decode": rep["rho_idf_decode"], "signature_recall": rep["recall"],
                     "layers_kept": rep["layers_kept"]})
    return pd.DataFrame(rows)


#: the signature modes of :func:`prefix_cache_ablation`
PREFIX_MODES = ("full prefill", "co-indexed", "suffix only")


def prefix_setup(workload: ConversationWorkload, cost: DecodeStepModel, n_workers: int = 16, *, calib_frac: float = 0.5,
                 n_pairs: int = 30000, seed: int = 0) -> ELDRSetup:
    """The shared-prefix conversation workload (:func:`moelab.eldr.prefix.generate_conversations`) split
    BY CONVERSATION: the first ``calib_frac`` of the conversations calibrate the signatures and centroids
    (offline, on full prefills), the other conversations' requests are the replay pool (served once each,
    through the prefix cache, by :func:`prefix_cache_ablation`)."""
    n_workers = check_int("n_workers", n_workers, low=1)
    calib_frac = check_real("calib_frac", calib_frac, low=0, high=1, low_open=True, high_open=True)
    trace = workload.trace
    g = trace.geometry
    cost.check_geometry(g.num_layers, g.num_experts, g.top_k)
    n_cal = int(round(calib_frac * workload.n_conversations))
    cal = np.flatnonzero(workload.conversation < n_cal)
    pool = np.flatnonzero(workload.conversation >= n_cal)
    if cal.size < max(2, n_workers) or pool.size < 1:
        raise ValueError(f"workload too small: {workload.n_conversations} conversations give {cal.size} calibration "
                         f"requests for n_workers={n_workers} (need >= max(2, n_workers)) and {pool.size} to serve")
    served = trace.subset(pool)
    return ELDRSetup(trace.subset(cal), served, cost, n_workers, n_pairs, seed, pack_expert_bits(served))


def prefix_cache_ablation(
    setup: ELDRSetup,
    workload: ConversationWorkload,
    *,
    rate: float = 60.0,
    capacity_blocks: int | Sequence[int] = 4096,
    block_size: int = 16,
    in_flight: int = 8,
    sessions: int = 64,
    output_len: int = 512,
    tau: float = 0.1,
    kind: str = "count_idf",
    slots: int = 256,
    seed: int = 0,
) -> pd.DataFrame:
    """Prefix caching and signatures, measured on the shared-prefix conversation workload.

    ``setup`` comes from :func:`prefix_setup` on ``workload``. Its served requests arrive as
    conversations (:func:`~moelab.eldr.prefix.conversation_arrivals`: ``rate`` in ELDR's unit, req/s
    at 16 decode workers, i.e. ``rate * K / 16`` req/s into the setup's ``K`` workers, from ``sessions``
    concurrent conversations) and go, in arrival order, through a KV-block signature cache of each
    size in ``capacity_blocks`` (:func:`~moelab.eldr.prefix.cache_signatures`). ELDR then runs the
    decode-cluster simulation on those arrivals once per signature mode: ``full prefill`` (no cache),
    ``co-indexed`` (sum over the whole block table, cached blocks included: equal to full prefill by the
    cache invariant — measured here, ``counts_equal_full``) and ``suffix only`` (the blocks the request
    computed itself), plus the best of the paper's baselines on the same arrivals. One row per mode and
    capacity: ``signature_err`` (mean cosine distance of the ``kind`` signatures to the full-prefill
    ones), ``hit_rate`` (prompt tokens served from cache), ``evictions``, ``prompt_blocks`` (the blocks all
    served prompts need together: a cache at least that large never fills), ``cached_tokens`` (per request,
    in arrival order, a tuple), ``workers`` (the decode worker of each request, in arrival order, a tuple: two
    rows with equal ``workers`` ran the same simulation), ``rerouted`` (requests on another worker than with
    full-prefill signatures), the run's metrics and where its TPOT tail comes from (:func:`tail_batches`)."""
    rate = check_real("rate", rate, low=0, low_open=True)
    output_len = check_int("output_len", output_len, low=1)
    check_choice("kind", kind, KINDS)
    caps = [capacity_blocks] if isinstance(capacity_blocks, (int, np.integer)) else list(capacity_blocks)
    if not caps:
        raise ValueError("capacity_blocks must name at least one cache size (blocks)")
    pool = setup.pool
    rows = workload.rows_of(pool.request_ids)
    sim_rate = rate * paper_rate_scale(setup.n_workers)
    arrival = conversation_arrivals(workload, rows, sim_rate=sim_rate, sessions=sessions, seed=seed)
    order = np.argsort(arrival, kind="stable")
    codes, _ = pool.domain_codes()
    offsets = rng_from(seed).integers(0, pool.decode_lens[order])
    reqs = RequestTrace(arrival[order], pool.prompt_lens[order], np.full(order.size, output_len), None,
                        f"shared-prefix conversations at {sim_rate:g} req/s (seed {seed})", {}, codes[order], None,
                        order, offsets)
    builder = setup.builder(kind)
    base = {"rate": float(rate), "sim_rate": float(sim_rate), "tau": tau, "kind": kind, "n_workers": setup.n_workers,
            "block_size": block_size, "in_flight": in_flight, "sessions": sessions}

    def run(router: str, sig: np.ndarray | None = None) -> dict:
        r = build_router(setup, router, tau=tau, kind=kind, seed=seed)
        res = simulate(reqs, r, setup.cost, n_workers=setup.n_workers, trace=pool,
                       signatures=sig if "signature" in r.requires else None, slots=slots, bits=setup.bits)
        workers = tuple(int(x) for x in res.requests["worker"])
        return {"router": router, **base, **res.metrics(), **tail_batches(res), "workers": workers}

    full = builder.transform(pool.prefill_counts)

    def err(sig: np.ndarray) -> float:
        return float(np.mean(1.0 - np.sum(full * sig, axis=1)))

    nan = float("nan")
    prompt_blocks = int((-(-pool.prompt_lens // block_size)).sum())
    first = run("eldr", full)
    out = [{**first, "prefix_cache": PREFIX_MODES[0], "capacity_blocks": nan, "hit_rate": nan,
            "evictions": nan, "prompt_blocks": prompt_blocks, "cached_tokens": None, "rerouted": 0,
            "signature_err": err(full), "counts_equal_full": True}]
    for cap in caps:
        cs = cache_signatures(workload, rows, arrival, block_size=block_size, capacity_blocks=cap, in_flight=in_flight)
        for mode, counts in zip(PREFIX_MODES[1:], (cs.coindexed, cs.suffix)):
            sig = builder.transform(counts)
            m = run("eldr", sig)
            out.append({**m, "prefix_cache": mode, "capacity_blocks": cs.capacity_blocks,
                        "hit_rate": cs.hit_rate, "evictions": cs.evictions, "prompt_blocks": prompt_blocks,
                        "cached_tokens": tuple(int(x) for x in cs.cached_tokens[order]),
                        "rerouted": int(np.sum(np.not_equal(m["workers"], first["workers"]))),
                        "signature_err": err(sig), "counts_equal_full": bool(np.array_equal(counts, cs.full))})
    best = min((run(r) for r in BASELINES), key=lambda m: m["tpot_ms_p50"])
    out.append({**best, "prefix_cache": f"best baseline ({best['router']})", "capacity_blocks": nan, "hit_rate": nan,
                "evictions": nan, "prompt_blocks": prompt_blocks, "cached_tokens": None, "rerouted": nan,
                "signature_err": nan, "counts_equal_full": nan})
    return pd.DataFrame(out)


def regime_map(scales: Sequence[float] = (0.25, 0.5, 1.0, 1.5), *, rates: Sequence[float] = PAPER_RATES,
               ks: Sequence[int] = (16,), taus: Sequence[float] = (0.1,), n_trace: int = 1024, n_requests: int = 2000,
               output_len: int = 512, n_pairs: int = 5000, model: str = "qwen3-30b-a3b", seed: int = 0,
               **config: Any) -> pd.DataFrame:
    """When does ELDR pay: p50/p99 TPOT gain over the best baseline and the distance to the domain
    oracle on a grid of locality strength x rate x K x tau. Locality strength is set by the synthetic
    generator's ``domain_scale`` (``scales``; 1 = the spread measured on OLMoE's counts) and REPORTED
    as the measured held-out count_idf rho of each generated workload (the heatmap's axis). Rates are
    scaled by K/16 (per-worker load of the 16-worker cluster). One row per (scale, K, tau, rate);
    ``eldr_mean_batch`` is ELDR's mean batch per step there (requests; what a cell's gain has to share)."""
    rows = []
    for sc in scales:
        check_real("scale", sc, low=0)
        base, _ = synthetic_setup(n_trace, model=model, n_workers=max(ks), n_pairs=n_pairs, seed=seed,
                                  domain_scale=float(sc), **config)
        rho = base.builder().report(base.pool, n_pairs=n_pairs)["rho"]
        for k in ks:
            setup = base if k == base.n_workers else with_workers(base, k)
            for rate in rates:
                kw = dict(rate=rate, n_requests=n_requests, output_len=output_len, seed=seed)
                runs = {r: run_one(setup, r, **kw) for r in (*BASELINES, "domain_oracle")}
                for tau in taus:
                    e = run_one(setup, "eldr", tau=tau, **kw)
                    res = {**runs, "eldr": e}
                    g50, b50 = gain_vs_best(res, "eldr", BASELINES)
                    g99, _ = gain_vs_best(res, "eldr", BASELINES, metric="tpot_ms_p99")
                    rows.append({"domain_scale": float(sc), "rho": rho, "n_workers": k, "tau": tau, "rate": float(rate),
                                 "p50_gain_pct": g50, "p99_gain_pct": g99, "best_baseline": b50,
                                 "oracle_gap_pct": 100 * (e["tpot_ms_p50"] / runs["domain_oracle"]["tpot_ms_p50"] - 1),
                                 "oracle_gain_pct": gain_vs_best(res, "domain_oracle", BASELINES)[0],
                                 "eldr_mean_batch": float(e["mean_batch"])})
    return pd.DataFrame(rows)


__all__ = ["BASELINES", "DEFAULT_SWEEP_K", "PAPER_DECODE_WORKERS", "PAPER_RATES", "paper_rate_scale", "adjusted_rand_index", "default_sweep", "paper_peak_rate",
           "projection_cost", "real_setup", "real_trace_report", "REAL_TRACE_STATISTICS", "SPREAD_LEVEL", "ELDR_SPREAD_SEEDS", "TAIL_PCT",
           "ablation_effect", "ablation_spread", "gain_budget", "gain_interval", "seed_spread", "tail_batches", "regime_map", "sweep_gains", "SWEEP_ROUTERS", "ELDRSetup", "build_router", "compare_with_paper", "gains",
           "kmeans_ablation", "LOAD_RANGE", "paper_gains", "rate_for_batch", "rate_for_load", "refit_ablation", "PREFIX_MODES", "prefix_cache_ablation",
           "prefix_setup", "prepare", "rate_sweep", "run_one",
           "signature_ablation", "synthetic_setup", "tau_sweep", "with_workers"]
