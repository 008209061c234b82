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

from dataclasses import dataclass

import numpy as np
import pandas as pd

from moelab._validate import check_int, check_real
from moelab.costmodel import DecodeStepModel
from moelab.routing import Router, make_router
from moelab.sim import gain_vs_best
from moelab.sim.cluster import simulate
from moelab.traces import replay_requests

#: instance routers compared (ELDR vs the load balancer both papers start from)
INSTANCE_ROUTERS = ("jsq", "eldr")
#: rank routers compared (BalanceRoute's two vs the load balancer)
RANK_ROUTERS = ("jsq", "br0", "brh")
BASELINE_PAIR = ("jsq", "jsq")


@dataclass
class CrossSetup:
    """What every run of one experiment shares: the ELDR setup (signatures, centroids per instance,
    replay pool, expert bits), the step model at the chosen attention share, and the cluster shape."""

    eldr: object  # moelab.eldr.experiments.ELDRSetup (imported lazily: a cross module, not a paper)
    cost: DecodeStepModel
    n_instances: int
    ranks: int
    slots: int
    attention_share: float | None
    output_len: int

    @property
    def reference_ctx(self) -> float:
        """Context (tokens) at which the attention share is set: mean prompt + half the output."""
        return float(self.eldr.pool.prompt_lens.mean()) + self.output_len / 2


def prepare(*, n_instances: int = 4, ranks: int = 4, slots: int = 64, model: str = "qwen3-30b-a3b",
            n_trace: int = 512, attention_share: float | None = None, output_len: int = 256, n_pairs: int = 5000,
            seed: int = 0, **workload: object) -> CrossSetup:
    """Generate the synthetic workload, fit signatures and ``n_instances`` centroids on its calibration
    half, and build the step model (attention at ``attention_share`` of a one-rank step at ``slots``
    requests of :attr:`CrossSetup.reference_ctx` tokens, or the shape's own layout when None)."""
    from moelab.eldr.experiments import synthetic_setup

    K = check_int("n_instances", n_instances, low=1, high=256)
    G = check_int("ranks", ranks, low=1, high=64)
    slots = check_int("slots", slots, low=1, high=4096)
    output_len = check_int("output_len", output_len, low=1, high=1 << 16)
    setup, _ = synthetic_setup(n_trace, model=model, n_workers=K, n_pairs=n_pairs, seed=seed, **workload)
    cs = CrossSetup(setup, setup.cost, K, G, slots, None, output_len)
    if attention_share is not None:
        attention_share = check_real("attention_share", attention_share, low=0, high=1, low_open=True, high_open=True)
        cost = setup.cost.with_attention_share(attention_share, slots, cs.reference_ctx)
        cs = CrossSetup(setup, cost, K, G, slots, attention_share, output_len)
    return cs


def variant(cs: CrossSetup, *, n_instances: int | None = None, ranks: int | None = None,
            attention_share: float | None = None, slots: int | None = None) -> CrossSetup:
    """The same workload and fitted signatures with another cluster shape or attention share (new
    centroids only when ``n_instances`` changes)."""
    from moelab.eldr.experiments import with_workers

    K = cs.n_instances if n_instances is None else check_int("n_instances", n_instances, low=1, high=256)
    G = cs.ranks if ranks is None else check_int("ranks", ranks, low=1, high=64)
    slots = cs.slots if slots is None else check_int("slots", slots, low=1, high=4096)
    eldr = cs.eldr if K == cs.n_instances else with_workers(cs.eldr, K)
    share = cs.attention_share if attention_share is None else attention_share
    out = CrossSetup(eldr, eldr.cost, K, G, slots, None, cs.output_len)
    if share is not None:
        share = check_real("attention_share", share, low=0, high=1, low_open=True, high_open=True)
        out = CrossSetup(eldr, eldr.cost.with_attention_share(share, slots, out.reference_ctx), K, G, slots, share,
                         cs.output_len)
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
    if name == "eldr":
        from moelab.eldr.routing import ELDRRouter

        return ELDRRouter(cs.eldr.centroids(), tau=tau, seed=seed)
    if name == "domain_oracle":
        return make_router(name, n_domains=cs.eldr.n_domains, seed=seed)
    return make_router(name, seed=seed)


def run_pair(cs: CrossSetup, instance: str, rank: str, *, rate: float, n_requests: int = 1000, tau: float = 0.1,
             seed: int = 0) -> dict:
    """One (instance router, rank router) pair on Poisson arrivals at ``rate`` req/s (same arrivals for
    every pair with the same seed); returns the run's metrics with the configuration."""
    rate = check_real("rate", rate, low=0, low_open=True)
    n_requests = check_int("n_requests", n_requests, low=1, high=200_000)
    sig = cs.eldr.signatures()
    reqs = replay_requests(cs.eldr.pool, rate=rate, n_requests=n_requests, output_len=cs.output_len, seed=seed,
                           signatures=sig)
    res = simulate(reqs, _instance_router(cs, instance, tau, seed), cs.cost, n_workers=cs.n_instances, slots=cs.slots,
                   trace=cs.eldr.pool, bits=cs.eldr.bits, ranks=cs.ranks, rank_router=make_router(rank, seed=seed))
    m = res.metrics()
    return {"instance_router": instance, "rank_router": rank, "pair": f"{instance} x {rank}", "rate": float(rate),
            "tau": float(tau), "K": cs.n_instances, "G": cs.ranks, "slots": cs.slots,
            "attention_share_set": cs.attention_share, **m}


def pair_grid(cs: CrossSetup, *, rate: float, instance_routers: tuple[str, ...] = INSTANCE_ROUTERS,
              rank_routers: tuple[str, ...] = RANK_ROUTERS, **kw: object) -> pd.DataFrame:
    """Every (instance router x rank router) pair on the same arrivals."""
    return pd.DataFrame([run_pair(cs, i, r, rate=rate, **kw) for i in instance_routers for r in rank_routers])


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


def gains_table(df: pd.DataFrame, metrics: tuple[str, ...] = ("tpot_ms_p50", "tpot_ms_p99", "ttft_ms_p50")) -> pd.DataFrame:
    """Every pair's gain (%) over JSQ x JSQ for each metric (rows: pairs, columns: metrics)."""
    base = df[(df["instance_router"] == BASELINE_PAIR[0]) & (df["rank_router"] == BASELINE_PAIR[1])]
    if base.empty:
        raise ValueError("the grid needs the baseline pair jsq x jsq")
    out = df[["pair", "instance_router", "rank_router"]].copy()
    for m in metrics:
        out[f"{m}_gain_pct"] = 100 * (1 - df[m].to_numpy() / float(base[m].iloc[0]))
    for c in ("distinct_per_layer_step", "avg_imbalance", "tpot_ms_p50"):
        if c in df.columns:
            out[c] = df[c].to_numpy()
    return out.reset_index(drop=True)


def rate_for_load(cs: CrossSetup, load: float = 0.7) -> float:
    """Arrival rate (req/s) at which each rank runs about ``load * slots`` requests (Little's law with
    the step model at that batch and uniform routing): comparable operating points across K, G, slots."""
    load = check_real("load", load, low=0, low_open=True, high=4)
    b = max(1, int(round(load * cs.slots)))
    B = np.full(cs.ranks, b)
    kv = np.full(cs.ranks, b * cs.reference_ctx)
    step_s = float(cs.cost.ep_step_ms(B, cs.cost.expected_sum_distinct(b * cs.ranks), kv)) / 1e3
    return cs.n_instances * cs.ranks * b / (cs.output_len * step_s)


__all__ = ["BASELINE_PAIR", "INSTANCE_ROUTERS", "RANK_ROUTERS", "CrossSetup", "gains", "gains_table", "pair_grid",
           "prepare", "rate_for_load", "run_pair", "share_sweep", "variant"]
