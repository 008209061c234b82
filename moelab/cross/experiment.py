"""ELDR picks the instance, BalanceRoute picks the rank: the first cross-paper experiment.

Deployment (the one both papers assume, one level each): a PD-disaggregated decode tier of ``K``
instances; each instance is a DP-attention + EP group of ``G`` barrier-synchronised ranks with
``slots`` batch slots each. Two-level routing:

* **instance router** (at arrival): ELDR's locality band (expert locality) or a load balancer;
* **rank router** (at every step boundary of the instance): BR-0 / BR-H (KV balance) or a load balancer.

Step time (:meth:`moelab.costmodel.DecodeStepModel.ep_step_ms`): the MoE part from the instance's
distinct experts over all its ranks' tokens (they all go through the same EP experts, each rank doing
1/G of it; all-to-all not modelled) + the slowest rank's attention and per-rank layer work + LM head.
So ELDR's gain lives in the MoE part and BalanceRoute's in the barrier: the experiment shows where each
survives the other and whether they add up.

Workload: the SYNTHETIC ELDR generator (``moelab.eldr.workload``) at a registry shape, replayed with
Poisson arrivals; the attention share of the step is a knob (:meth:`DecodeStepModel.with_attention_share`,
a heavier KV layout / longer context) — a projection, not a measurement of a deployment.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from moelab._stats import interval_verdict, t_half_width
from moelab._validate import check_int, check_real
from moelab.costmodel import DecodeStepModel
from moelab.eldr.experiments import ELDRSetup, build_router, synthetic_setup, with_workers
from moelab.routers import make_router
from moelab.routing import Router
from moelab.sim import gain_vs_best
from moelab.sim.cluster import simulate
from moelab.traces import RequestTrace, load_azure_trace, replay_requests

#: instance routers compared (ELDR vs the load balancer both papers start from)
INSTANCE_ROUTERS = ("jsq", "eldr")
#: rank routers compared (BalanceRoute's two vs the load balancer)
RANK_ROUTERS = ("jsq", "br0", "brh")
#: The (instance router, rank router) pair every gain is measured against: JSQ x JSQ.
BASELINE_PAIR = ("jsq", "jsq")


@dataclass
class CrossSetup:
    """What every run of one experiment shares: the ELDR setup (signatures, centroids per instance,
    replay pool, expert bits), the step model at the chosen attention share, and the cluster shape."""

    eldr: ELDRSetup
    cost: DecodeStepModel
    n_instances: int
    ranks: int
    slots: int
    attention_share: float | None
    output_len: int
    lengths: tuple[np.ndarray, np.ndarray] | None = None
    lengths_note: str = "fixed output length; prompt lengths of the replayed trace rows"

    @property
    def mean_output(self) -> float:
        """Mean output length of the workload (tokens)."""
        return float(self.lengths[1].mean()) if self.lengths is not None else float(self.output_len)

    @property
    def reference_ctx(self) -> float:
        """Context (tokens) at which the attention share is set: mean prompt + half the mean output."""
        prompt = self.lengths[0].mean() if self.lengths is not None else self.eldr.pool.prompt_lens.mean()
        return float(prompt) + self.mean_output / 2


def azure_lengths(kind: str = "conv", max_output: int = 512) -> tuple[tuple[np.ndarray, np.ndarray], str]:
    """(prompt, output) length pairs of the Azure LLM inference trace 2023 (bundled public data), with
    requests longer than ``max_output`` output tokens left out and counted in the note."""
    max_output = check_int("max_output", max_output, low=1, high=1 << 16)
    t = load_azure_trace(kind).filter_lengths(max_output=max_output)
    dropped = sum(t.dropped.values())
    return (t.prompt_len, t.output_len), (f"prompt/output lengths resampled from Azure LLM trace 2023 ({kind}); "
                                          f"{dropped} of {len(t) + dropped} requests with output > {max_output} "
                                          f"or empty left out")


def prepare(*, n_instances: int = 4, ranks: int = 4, slots: int = 64, model: str = "qwen3-30b-a3b",
            n_trace: int = 512, attention_share: float | None = None, output_len: int = 256, n_pairs: int = 5000,
            lengths: str | None = "azure-conv", seed: int = 0, **workload: object) -> CrossSetup:
    """Generate the synthetic workload, fit signatures and ``n_instances`` centroids on its calibration
    half, and build the step model (attention at ``attention_share`` of a one-rank step at ``slots``
    requests of :attr:`CrossSetup.reference_ctx` tokens, or the shape's own layout when None).

    ``lengths``: ``"azure-conv"`` / ``"azure-code"`` draw each request's prompt and output length from
    the Azure 2023 trace (outputs capped at ``output_len``, the rest left out and counted — real length
    variance is what KV balancing acts on); ``None`` keeps a fixed ``output_len`` and the replayed
    trace rows' prompt lengths."""
    if lengths not in (None, "azure-conv", "azure-code"):
        raise ValueError(f"lengths must be one of [None, 'azure-conv', 'azure-code']; got {lengths!r}")

    K = check_int("n_instances", n_instances, low=1, high=256)
    G = check_int("ranks", ranks, low=1, high=64)
    slots = check_int("slots", slots, low=1, high=4096)
    output_len = check_int("output_len", output_len, low=1, high=1 << 16)
    setup, _ = synthetic_setup(n_trace, model=model, n_workers=K, n_pairs=n_pairs, seed=seed, **workload)
    pool, note = (None, CrossSetup.lengths_note) if lengths is None else azure_lengths(lengths[6:], output_len)
    cs = CrossSetup(setup, setup.cost, K, G, slots, None, output_len, pool, note)
    return variant(cs, attention_share=attention_share) if attention_share is not None else cs


def variant(cs: CrossSetup, *, n_instances: int | None = None, ranks: int | None = None,
            attention_share: float | None = None, slots: int | None = None) -> CrossSetup:
    """The same workload and fitted signatures with another cluster shape or attention share (new
    centroids only when ``n_instances`` changes)."""
    K = cs.n_instances if n_instances is None else check_int("n_instances", n_instances, low=1, high=256)
    G = cs.ranks if ranks is None else check_int("ranks", ranks, low=1, high=64)
    slots = cs.slots if slots is None else check_int("slots", slots, low=1, high=4096)
    eldr = cs.eldr if K == cs.n_instances else with_workers(cs.eldr, K)
    share = cs.attention_share if attention_share is None else attention_share
    out = replace(cs, eldr=eldr, cost=eldr.cost, n_instances=K, ranks=G, slots=slots, attention_share=None)
    if share is not None:
        share = check_real("attention_share", share, low=0, high=1, low_open=True, high_open=True)
        out = replace(out, cost=eldr.cost.with_attention_share(share, slots, out.reference_ctx), attention_share=share)
    return out


def share_sweep(cs: CrossSetup, shares: tuple[float, ...], *, load: float = 1.3, **kw: object) -> pd.DataFrame:
    """:func:`gains` at each attention share (rate set per share by :func:`rate_for_load`)."""
    rows = []
    for share in shares:
        v = variant(cs, attention_share=share)
        rate = rate_for_load(v, load)
        rows.append({"attention_share": float(share), "rate": rate, **gains(pair_grid(v, rate=rate, **kw))})
    return pd.DataFrame(rows)


def _instance_router(cs: CrossSetup, name: str, tau: float, seed: int) -> Router:
    # the ELDR half's calibration prepares the instance router (ELDR's centroids, the oracle's domain count)
    return build_router(cs.eldr, name, tau=tau, seed=seed)


def run_pair(cs: CrossSetup, instance: str, rank: str, *, rate: float, n_requests: int = 1000, tau: float = 0.1,
             seed: int = 0) -> dict:
    """One (instance router, rank router) pair on Poisson arrivals at ``rate`` req/s (same arrivals for
    every pair with the same seed); returns the run's metrics with the configuration.

    ``rate`` is the simulated cluster's own req/s, offered as is to its ``n_instances`` instances (e.g.
    :func:`rate_for_load`); unlike ELDR's ``rate`` (req/s at 16 decode workers, scaled by ``K / 16``) it
    is not rescaled: a paper-unit ELDR rate ``r`` is ``r * paper_rate_scale(n_instances)`` here."""
    rate = check_real("rate", rate, low=0, low_open=True)
    n_requests = check_int("n_requests", n_requests, low=1, high=200_000)
    sig = cs.eldr.signatures()
    reqs = replay_requests(cs.eldr.pool, rate=rate, n_requests=n_requests, output_len=cs.output_len, seed=seed,
                           signatures=sig)
    if cs.lengths is not None:  # real length pairs, drawn with their own seeded stream (same for every pair)
        pick = np.random.default_rng([seed, 7]).integers(0, cs.lengths[0].size, size=n_requests)
        reqs = RequestTrace(reqs.arrival_s, cs.lengths[0][pick], cs.lengths[1][pick], None, cs.lengths_note, {},
                            reqs.domain, reqs.signature, reqs.trace_row, reqs.trace_offset)
    res = simulate(reqs, _instance_router(cs, instance, tau, seed), cs.cost, n_workers=cs.n_instances, slots=cs.slots,
                   trace=cs.eldr.pool, bits=cs.eldr.bits, ranks=cs.ranks, rank_router=make_router(rank, seed=seed))
    m = res.metrics()
    return {"instance_router": instance, "rank_router": rank, "pair": f"{instance} x {rank}", "rate": float(rate),
            "tau": float(tau), "K": cs.n_instances, "G": cs.ranks, "slots": cs.slots,
            "attention_share_set": cs.attention_share, "lengths": cs.lengths_note, **m}


def pair_grid(cs: CrossSetup, *, rate: float, instance_routers: tuple[str, ...] = INSTANCE_ROUTERS,
              rank_routers: tuple[str, ...] = RANK_ROUTERS, **kw: object) -> pd.DataFrame:
    """Every (instance router x rank router) pair on the same arrivals."""
    return pd.DataFrame([run_pair(cs, i, r, rate=rate, **kw) for i in instance_routers for r in rank_routers])


#: arrival draws the cross-paper spread check runs: the headline's seed and the next ones (ELDR's own notebook
#: repeats over its own count; this one is the cross-paper experiment's)
CROSS_SPREAD_SEEDS = 3


def pair_grids(cs: CrossSetup, *, rate: float, seeds: tuple[int, ...], **kw: object) -> pd.DataFrame:
    """:func:`pair_grid` once per seed (each seed draws its own arrivals, lengths and routers' coins), with a
    ``seed`` column: how much of a pair's gain belongs to one draw of the arrivals.

    Parameters
    ----------
    cs : CrossSetup
        The experiment's setup (:func:`prepare`).
    rate : float
        Arrival rate (req/s to the whole cluster, > 0; e.g. :func:`rate_for_load`).
    seeds : tuple of int
        The draws, at least one, each once (a repeated seed would count one draw twice).
    **kw
        Passed to :func:`run_pair` (``n_requests``, ``tau``); not ``seed``.

    Returns
    -------
    DataFrame
        :func:`pair_grid`'s rows for every seed, in the order of ``seeds``, with a ``seed`` column.
    """
    seeds = tuple(seeds)
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    seeds = tuple(check_int("seeds", s) for s in seeds)
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"seeds must be distinct (a repeated seed counts one draw twice); {repeated} repeat in {seeds}")
    if "seed" in kw:
        raise ValueError("pair_grids takes its seeds from `seeds`, not `seed`")
    frames = [pair_grid(cs, rate=rate, seed=s, **kw).assign(seed=s) for s in seeds]
    return pd.concat(frames, ignore_index=True)


def gains_by_seed(grids: pd.DataFrame, metric: str = "tpot_ms_p50") -> pd.DataFrame:
    """:func:`gains` of each seed's grid in :func:`pair_grids`'s frame, one row per seed, with the
    ``interaction_pts`` (``both - additive``, percentage points).

    Parameters
    ----------
    grids : DataFrame
        :func:`pair_grids`'s frame: a ``seed`` column and each pair at most once per seed.
    metric : str
        The latency column the gains are of (lower is better).

    Returns
    -------
    DataFrame
        One row per seed (ascending): ``seed``, :func:`gains`'s keys and ``interaction_pts``.
    """
    if "seed" not in grids.columns:
        raise ValueError("grids needs a seed column (pair_grids' frame)")
    twice = grids[grids.duplicated(["seed", "pair"], keep=False)]
    if len(twice):
        first = twice.iloc[0]
        raise ValueError(f"grids holds pair {first['pair']!r} more than once for seed {int(first['seed'])} "
                         "(a seed repeated in pair_grids, or two frames concatenated): each seed's grid is one draw")
    rows = []
    for seed, grid in grids.groupby("seed", sort=True):
        g = gains(grid, metric)
        rows.append({"seed": int(seed), **g, "interaction_pts": g["both_gain_pct"] - g["additive_gain_pct"]})
    return pd.DataFrame(rows)


def br_share_trend(cs: CrossSetup, shares: tuple[float, ...], *, seeds: tuple[int, ...], load: float = 1.3,
                   known: dict[float, pd.DataFrame] | None = None, **kw: object) -> pd.DataFrame:
    """BalanceRoute's gain alone (``br_only``) at each attention share on each draw: the evidence for "its gain
    grows with the attention share", measured on the same draws as the seed spread.

    Only the three pairs with a JSQ instance router run (JSQ x JSQ, JSQ x BR-0, JSQ x BR-H): ``br_only`` needs no
    other. At each share the rate is re-set to the same ``load`` (:func:`rate_for_load`).

    Parameters
    ----------
    cs : CrossSetup
        The experiment's setup (:func:`prepare`); each share is a :func:`variant` of it.
    shares : tuple of float
        Attention shares, each in (0, 1), distinct, at least one.
    seeds : tuple of int
        The draws (as :func:`pair_grids` takes them).
    load : float
        Offered load, a multiple of the slot capacity (:func:`rate_for_load`).
    known : dict, optional
        ``{share: pair_grids frame}`` already run at that share and rate on the same seeds (e.g. the seed spread at
        the setup's own share): reused instead of run again; its rate must be the share's.
    **kw
        Passed to :func:`run_pair` (``n_requests``, ``tau``).

    Returns
    -------
    DataFrame
        One row per (share, seed), shares ascending: ``attention_share``, ``seed``, ``rate``, ``attn_scale`` (the
        factor on the KV bytes attention reads that sets the share), ``br_only_gain_pct`` and ``br_only_pair``.
    """
    shares = tuple(check_real("shares", s, low=0, high=1, low_open=True, high_open=True) for s in shares)
    if not shares or len(set(shares)) != len(shares):
        raise ValueError(f"shares must name at least one attention share, each once; got {shares}")
    known = {} if known is None else dict(known)
    rows = []
    for share in sorted(shares):
        v = variant(cs, attention_share=share)
        rate = rate_for_load(v, load)
        reuse = next((g for s, g in known.items() if np.isclose(s, share)), None)
        if reuse is not None and not np.allclose(reuse["rate"].to_numpy(dtype=float), rate):
            raise ValueError(f"the known grids at share {share:g} ran at another rate than this share's {rate:.3f} "
                             f"req/s at load {load:g}: pass grids run at rate_for_load")
        grids = reuse if reuse is not None else pair_grids(v, rate=rate, seeds=seeds, instance_routers=("jsq",), **kw)
        for seed, grid in grids.groupby("seed", sort=True):
            g = gains(grid)
            rows.append({"attention_share": float(share), "seed": int(seed), "rate": float(rate),
                         "attn_scale": float(v.cost.attn_scale), "br_only_gain_pct": g["br_only_gain_pct"],
                         "br_only_pair": g["br_only_pair"]})
    return pd.DataFrame(rows)


def eldr_added_summary(by_seed: pd.DataFrame, *, level: float = 0.95) -> dict[str, object]:
    """Does ELDR still add a gain on top of a BalanceRoute rank router? Each draw's ``both - br_only`` (percentage
    points of p50 TPOT gain) and a Student-t interval of their mean over the draws (the draws are the replicates),
    the same evidence standard as :func:`share_trend_summary`.

    ``both`` minus ``br_only`` is ELDR's own contribution: ``both`` against ``eldr_only`` would pass on
    BalanceRoute's gain even where ELDR adds nothing, and counting the draws whose difference is positive ignores
    how far the draws' noise reaches.

    Parameters
    ----------
    by_seed : DataFrame
        :func:`gains_by_seed`'s rows (columns ``seed``, ``both_gain_pct``, ``br_only_gain_pct``).
    level : float
        Confidence level of the interval, in (0, 1).

    Returns
    -------
    dict
        ``n_draws``, ``level``; ``added_by_seed`` (points, per draw), ``added_min``, ``added_max``,
        ``added_mean``, ``added_lo``, ``added_hi`` (the interval, NaN with fewer than two draws), ``n_positive``
        (draws where ELDR adds a gain) and ``verdict`` (the interval against 0: ``"ahead"`` = ELDR
        adds a gain, ``"behind"`` = it costs, or ``"not distinguishable"``).
    """
    level = check_real("level", level, low=0, high=1, low_open=True, high_open=True)
    need = {"seed", "both_gain_pct", "br_only_gain_pct"}
    if not need <= set(by_seed.columns) or by_seed.empty:
        raise ValueError(f"by_seed must be gains_by_seed's rows (columns {sorted(need)}); got {list(by_seed.columns)}")
    ordered = by_seed.sort_values("seed")
    added = (ordered["both_gain_pct"] - ordered["br_only_gain_pct"]).to_numpy(dtype=float)
    mean = float(added.mean())
    lo = hi = float("nan")
    if added.size >= 2:
        half = t_half_width(added, level)
        lo, hi = mean - half, mean + half
    return {"n_draws": int(added.size), "level": level,
            "added_by_seed": {int(s): float(a) for s, a in zip(ordered["seed"], added)},
            "added_min": float(added.min()), "added_max": float(added.max()), "added_mean": mean,
            "added_lo": lo, "added_hi": hi, "n_positive": int((added > 0).sum()), "verdict": interval_verdict(lo, hi)}


def share_trend_summary(trend: pd.DataFrame, *, level: float = 0.95) -> dict[str, object]:
    """Does BalanceRoute's gain grow with the attention share? Each draw's least-squares slope of ``br_only``
    against the share, and a Student-t interval of their mean over the draws (the draws are the replicates).

    Parameters
    ----------
    trend : DataFrame
        :func:`br_share_trend`'s rows.
    level : float
        Confidence level of the interval, in (0, 1).

    Returns
    -------
    dict
        ``n_shares``, ``n_draws``; ``slope_by_seed`` (points of gain per 10 points of share, per draw),
        ``slope_mean``, ``slope_lo``, ``slope_hi`` (the interval, NaN with fewer than two shares or draws),
        ``n_rising`` (draws whose slope is > 0), ``verdict`` (the interval against 0:
        ``"ahead"`` = the gain grows, ``"behind"`` = it shrinks, or ``"not distinguishable"``; ``"not tested"``
        with one share) and ``by_share`` (per share: mean, lowest and highest gain over the draws).
    """
    level = check_real("level", level, low=0, high=1, low_open=True, high_open=True)
    need = {"attention_share", "seed", "br_only_gain_pct"}
    if not need <= set(trend.columns) or trend.empty:
        raise ValueError(f"trend must be br_share_trend's rows (columns {sorted(need)}); got {list(trend.columns)}")
    by_share = (trend.groupby("attention_share", sort=True)["br_only_gain_pct"]
                .agg(mean="mean", low="min", high="max").reset_index())
    n_shares, seeds = len(by_share), sorted(trend["seed"].unique())
    slopes = {}
    if n_shares >= 2:
        for seed, d in trend.groupby("seed", sort=True):
            slopes[int(seed)] = float(0.1 * np.polyfit(d["attention_share"], d["br_only_gain_pct"], 1)[0])
    s = np.array(list(slopes.values()))
    mean = float(s.mean()) if s.size else float("nan")
    lo = hi = float("nan")
    if s.size >= 2:
        half = t_half_width(s, level)
        lo, hi = mean - half, mean + half
    return {"n_shares": n_shares, "n_draws": len(seeds), "level": level, "slope_by_seed": slopes,
            "slope_mean": mean, "slope_lo": lo, "slope_hi": hi, "n_rising": int((s > 0).sum()),
            "verdict": "not tested" if n_shares < 2 else interval_verdict(lo, hi),
            "by_share": by_share.to_dict("records")}


def expert_term_ms(cs: CrossSetup, distinct_per_layer: float, batch: float) -> float:
    """The step model's price of the expert term ``t_e * sum_l D_l``: the part of the step ELDR can move.

    The difference of two such prices is what a cut of distinct experts saves per step.

    Parameters
    ----------
    cs : CrossSetup
        The experiment's setup (its step model and ranks per instance).
    distinct_per_layer : float
        Distinct experts each MoE layer loads per step, >= 0.
    batch : float
        Tokens per instance step, >= 0, split evenly over its ranks.

    Returns
    -------
    float
        Milliseconds: the step with those experts minus the same step with none.
    """
    distinct_per_layer = check_real("distinct_per_layer", distinct_per_layer, low=0)
    batch = check_real("batch", batch, low=0)
    ranks = np.full(cs.ranks, batch / cs.ranks)
    kv = np.zeros(cs.ranks)
    layers = cs.cost.num_layers
    with_experts = float(cs.cost.ep_step_ms(ranks, distinct_per_layer * layers, kv))
    return with_experts - float(cs.cost.ep_step_ms(ranks, 0.0, kv))


def eldr_lever(cs: CrossSetup, grid: pd.DataFrame) -> dict[str, float]:
    """The step model's price of ELDR's lever in one grid: what ``eldr x jsq``'s cut of distinct experts
    (against ``jsq x jsq``) saves per step at JSQ x JSQ's mean batch, in ms and as a share of JSQ x JSQ's
    mean step. A price of the expert term, not a bound on a latency percentile.

    Parameters
    ----------
    cs : CrossSetup
        The setup the grid ran on.
    grid : DataFrame
        One draw's :func:`pair_grid` (both pairs once, with ``distinct_per_layer_step``, ``mean_batch`` and
        ``step_ms_mean``).

    Returns
    -------
    dict
        ``saved_ms`` and ``step_ms`` (ms), ``lever_pct`` (% of the mean step).
    """
    rows = grid.set_index("pair")
    missing = [p for p in ("jsq x jsq", "eldr x jsq") if p not in rows.index]
    if missing:
        raise ValueError(f"grid needs the pairs 'jsq x jsq' and 'eldr x jsq'; {missing} missing")
    if not rows.index.is_unique:
        raise ValueError("grid holds a pair more than once: pass one draw (one seed of pair_grids)")
    base, eldr = rows.loc["jsq x jsq"], rows.loc["eldr x jsq"]
    batch = float(base["mean_batch"])
    saved = (expert_term_ms(cs, float(base["distinct_per_layer_step"]), batch)
             - expert_term_ms(cs, float(eldr["distinct_per_layer_step"]), batch))
    step = float(base["step_ms_mean"])
    return {"saved_ms": float(saved), "step_ms": step, "lever_pct": float(100 * saved / step)}


#: how :func:`interaction_pattern` reads the draws' ``both - additive`` points
INTERACTION_PATTERNS = ("above", "below", "additive", "mixed_sign", "at_or_above", "at_or_below")


def interaction_pattern(interaction_pts: object, tolerance: float) -> str:
    """What a set of draws says about ``both - additive`` (percentage points), one of
    :data:`INTERACTION_PATTERNS`: ``"above"`` / ``"below"`` every draw more than ``tolerance`` above / below
    additive; ``"additive"`` every draw within ``tolerance``; ``"mixed_sign"`` some draws more than ``tolerance``
    above and some more than ``tolerance`` below; ``"at_or_above"`` / ``"at_or_below"`` no draw more than
    ``tolerance`` below / above, some within ``tolerance`` and some beyond it on the other side. A draw within
    ``tolerance`` counts as additive whatever its sign: the same reading as "the two gains add up (within
    ``tolerance``)", so a draw a little below zero is not called sub-additive.

    Parameters
    ----------
    interaction_pts : array-like
        One value per draw, finite, at least one.
    tolerance : float
        Points, >= 0.

    Returns
    -------
    str
        The pattern.
    """
    x = np.asarray(interaction_pts, dtype=np.float64).ravel()
    if x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"interaction_pts must hold at least one finite value; got {x.tolist()!r:.80}")
    tolerance = check_real("tolerance", tolerance, low=0)
    if x.min() > tolerance:
        return "above"
    if x.max() < -tolerance:
        return "below"
    if np.abs(x).max() <= tolerance:
        return "additive"
    if x.min() < -tolerance and x.max() > tolerance:
        return "mixed_sign"
    return "at_or_above" if x.min() >= -tolerance else "at_or_below"


def gains(df: pd.DataFrame, metric: str = "tpot_ms_p50") -> dict[str, object]:
    """Gains (%) over JSQ x JSQ: each paper alone, both, the best pair, and whether they add up.

    ``eldr_only``: ELDR x JSQ; ``br_only``: the better of JSQ x BR-0 / JSQ x BR-H; ``both``: the best
    ELDR x BR pair; ``additive``: ``eldr_only + br_only`` (what independent gains would give)."""
    res = {f"{r['instance_router']} x {r['rank_router']}": r for r in df.to_dict("records")}
    base = " x ".join(BASELINE_PAIR)
    if base not in res:
        raise ValueError(f"the grid needs the baseline pair {base!r}; has {sorted(res)}")

    def g(pairs: list[str]) -> tuple[float, str]:
        pairs = [p for p in pairs if p in res]
        if not pairs:
            return float("nan"), ""
        # the best of ``pairs`` against the baseline pair (gain_vs_best with the roles swapped)
        loss, best = gain_vs_best(res, base, pairs, metric=metric)
        return float(100 * (1 - res[best][metric] / res[base][metric])), best

    eldr_only, _ = g(["eldr x jsq"])
    br_only, br_pair = g(["jsq x br0", "jsq x brh"])
    both, both_pair = g(["eldr x br0", "eldr x brh"])
    best, best_pair = g(sorted(set(res) - {base}))
    return {"metric": metric, "baseline_pair": base, "eldr_only_gain_pct": eldr_only, "br_only_gain_pct": br_only,
            "br_only_pair": br_pair, "both_gain_pct": both, "both_pair": both_pair,
            "additive_gain_pct": eldr_only + br_only, "best_pair": best_pair, "best_pair_gain_pct": best}


def pair_gains_table(df: pd.DataFrame, metrics: tuple[str, ...] = ("tpot_ms_p50", "tpot_ms_p99", "ttft_ms_p50")) -> pd.DataFrame:
    """Every pair's gain (%) over JSQ x JSQ for each metric (rows: pairs, columns: metrics)."""
    base = df[(df["instance_router"] == BASELINE_PAIR[0]) & (df["rank_router"] == BASELINE_PAIR[1])]
    if base.empty:
        raise ValueError("the grid needs the baseline pair jsq x jsq")
    out = df[["pair", "instance_router", "rank_router"]].copy()
    for m in metrics:
        out[f"{m}_gain_pct"] = 100 * (1 - df[m].to_numpy() / float(base[m].iloc[0]))
    for c in ("distinct_per_layer_step", "avg_imbalance", "tpot_ms_p50", "rate"):
        if c in df.columns:
            out[c] = df[c].to_numpy()
    return out.reset_index(drop=True)


def rate_for_load(cs: CrossSetup, load: float = 0.7) -> float:
    """Arrival rate (req/s to this cluster's ``n_instances`` instances, the unit :func:`run_pair` takes; not
    ELDR's req/s at 16 workers) that offers ``load`` times the slot capacity: Little's law with every rank
    running ``slots`` requests, the step priced by the step model with the distinct experts of random
    full-instance batches of the replay pool (measured on the trace, not assumed uniform)."""
    load = check_real("load", load, low=0, low_open=True, high=4)
    rng = np.random.default_rng(cs.eldr.seed)
    pool = cs.eldr.pool
    ok = np.flatnonzero(pool.decode_lens > 0)
    n = cs.ranks * cs.slots
    sums = [float(pool.distinct_experts(rng.choice(ok, size=n, replace=ok.size < n),
                                        rng.integers(0, 1 << 20, size=n)).sum()) for _ in range(8)]
    B = np.full(cs.ranks, cs.slots)
    kv = np.full(cs.ranks, cs.slots * cs.reference_ctx)
    step_s = float(cs.cost.ep_step_ms(B, float(np.mean(sums)), kv)) / 1e3
    return load * cs.n_instances * n / (cs.mean_output * step_s)


__all__ = ["BASELINE_PAIR", "CROSS_SPREAD_SEEDS", "INSTANCE_ROUTERS", "INTERACTION_PATTERNS", "RANK_ROUTERS", "CrossSetup",
           "br_share_trend", "eldr_added_summary", "eldr_lever", "expert_term_ms", "gains", "interaction_pattern",
           "gains_by_seed", "pair_gains_table", "pair_grid", "pair_grids", "prepare", "rate_for_load", "run_pair",
           "share_sweep", "share_trend_summary", "variant"]
