"""The compiled event loop of the decode-cluster simulator (independent instances, ``ranks=1``) equals the
Python loop bit for bit: every request's worker, admit/first/finish time and every step row. Timing lives
in the bench (``eldr_sim_worker_steps_per_s``), not here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moelab.costmodel import DecodeStepModel, ModelShape
from moelab.routers import make_router, router_names
from moelab.sim import cluster
from moelab.sim.cluster import MAX_GROUP_DECODE_TOKENS, MAX_REQUESTS, _simulate, supplied_fields
from moelab.traces import ExpertTrace, Geometry, RequestTrace, replay_requests


def _trace(n: int = 12, L: int = 3, E: int = 130, k: int = 4, seed: int = 0) -> ExpertTrace:
    """Decode tokens of uneven lengths; E = 130 packs each layer into three uint64 words."""
    rng = np.random.default_rng(seed)
    dec = [np.stack([np.stack([rng.choice(E, k, replace=False) for _ in range(L)]) for _ in range(T)])
           for T in rng.integers(1, 9, n)]
    return ExpertTrace.from_requests(request_ids=[str(i) for i in range(n)], domains=["a", "b"] * (n // 2),
                                     prompt_tokens=[np.arange(5 + i) for i in range(n)],
                                     prefill_counts=np.array([[rng.multinomial((5 + i) * k, np.full(E, 1 / E)) for _ in range(L)] for i in range(n)]),
                                     decode_ids=dec,
                                     geometry=Geometry(L, E, k, "tiny"))


def _cost(L: int = 3, E: int = 130, k: int = 4) -> DecodeStepModel:
    return DecodeStepModel.h200(ModelShape(L, 128, 4, 2, 32, 500, num_experts=E, top_k=k, expert_ffn=64))


def _both(reqs: RequestTrace, make, **kw) -> None:
    """Run both loops on fresh routers and require identical results."""
    fast = _simulate(reqs, make(), python_loop=False, **kw)
    ref = _simulate(reqs, make(), python_loop=True, **kw)
    pd.testing.assert_frame_equal(fast.requests, ref.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, ref.steps, check_exact=True)
    assert (fast.router, fast.n_workers, fast.slots, fast.num_layers, fast.info) == \
        (ref.router, ref.n_workers, ref.slots, ref.num_layers, ref.info)
    assert np.isfinite(fast.requests["finish_s"]).all()


def test_every_router_gives_the_same_run_in_both_loops():
    """Queues form (3 slots), output lengths vary, and routers that read the running requests see them."""
    tr = _trace()
    n = 80
    reqs = replay_requests(tr, rate=900.0, n_requests=n, output_len=np.arange(n) % 11 + 1, seed=3)
    reqs = reqs.with_columns(signature=np.random.default_rng(0).random((n, 16)))
    kwargs = {"eldr": {"centroids": np.random.default_rng(1).random((3, 16))}, "domain_oracle": {"n_domains": 2}}
    names = router_names(supplied=supplied_fields(reqs))
    assert {"eldr", "br0", "brh", "jsq", "round_robin"} <= set(names)
    for name in names:
        kw = kwargs.get(name, {"kv_capacity_tokens": 10_000} if name.startswith("vllm_dp@") and name != "vllm_dp@legacy"
                        else {})
        _both(reqs, lambda name=name, kw=kw: make_router(name, **kw), cost=_cost(), n_workers=3, slots=3, trace=tr)


@pytest.mark.parametrize("n_workers", [1, 5, 8])
def test_bursts_ties_and_idle_gaps(n_workers):
    """Requests arriving at the same instant (ties between arrivals and step ends), a gap that empties the
    cluster, a worker count that is not a power of two."""
    tr = _trace(seed=1)
    rng = np.random.default_rng(2)
    arrival = np.sort(np.concatenate([np.zeros(30), rng.uniform(0, 0.02, 30), np.full(20, 5.0),
                                      rng.uniform(5.0, 5.01, 20)]))
    n = arrival.size
    reqs = RequestTrace(arrival, rng.integers(1, 4000, n), rng.integers(1, 40, n), trace_row=rng.integers(0, 12, n),
                        trace_offset=rng.integers(0, 50, n))
    for router in ("round_robin", "jsq", "least_kv"):
        _both(reqs, lambda router=router: make_router(router), cost=_cost(), n_workers=n_workers, slots=4, trace=tr)


def test_uniform_pricing_without_trace_rows():
    rng = np.random.default_rng(4)
    n = 50
    reqs = RequestTrace(np.sort(rng.uniform(0, 0.05, n)), rng.integers(1, 3000, n), rng.integers(1, 30, n))
    _both(reqs, lambda: make_router("jsq"), cost=_cost(), n_workers=3, slots=5)


def test_step_log_growth(monkeypatch):
    """The compiled loop's step log starts tiny here, so it grows many times during the run."""
    monkeypatch.setattr(cluster, "_LOG_START", 3)
    tr = _trace(seed=5)
    reqs = replay_requests(tr, rate=400.0, n_requests=40, output_len=9, seed=6)
    _both(reqs, lambda: make_router("jsq"), cost=_cost(), n_workers=4, slots=2, trace=tr)


def test_request_and_group_token_caps():
    n = MAX_REQUESTS + 1
    many = RequestTrace(np.zeros(n), np.ones(n), np.ones(n))
    with pytest.raises(ValueError, match="MAX_REQUESTS"):
        cluster.simulate(many, make_router("jsq"), _cost(), n_workers=1)
    per = MAX_GROUP_DECODE_TOKENS // 2 + 1
    big = RequestTrace(np.zeros(2), np.ones(2), np.full(2, per))
    with pytest.raises(ValueError, match="MAX_GROUP_DECODE_TOKENS"):
        cluster.simulate(big, make_router("jsq"), _cost(), n_workers=1, ranks=2, rank_router=make_router("jsq"))
    cluster.simulate(RequestTrace(np.zeros(2), np.ones(2), np.full(2, 3)), make_router("jsq"), _cost(), n_workers=1,
                     ranks=2, rank_router=make_router("jsq"))  # under both caps: runs
