"""The shared router interface and the load-balancing baselines."""

from __future__ import annotations

import numpy as np
import pytest

from moelab.routers import available_routers, make_router
from moelab.routing import ClusterView, RequestBatch

BASELINES = ["round_robin", "random", "jsq", "p2c", "least_kv", "vllm_dp"]


def test_registry_lists_every_system():
    names = available_routers()
    for name in BASELINES + ["eldr", "domain_oracle", "br0", "brh"]:
        assert name in names
    with pytest.raises(ValueError, match="router must be one of"):
        make_router("fastest")


@pytest.mark.parametrize("name", BASELINES)
def test_baselines_respect_free_slots_and_are_seeded(name):
    view = ClusterView(active=[3, 0, 1, 0], kv_tokens=[300, 0, 50, 10], free_slots=[0, 2, 1, 0])
    batch = RequestBatch(prompt_len=np.full(5, 10))
    a = make_router(name, seed=3).reset(4).route(batch, view)
    b = make_router(name, seed=3).reset(4).route(batch, view)
    assert np.array_equal(a, b)
    placed = a[a >= 0]
    assert placed.size == 3 and set(placed.tolist()) <= {1, 2}  # only 3 free slots, on workers 1 and 2
    assert (a[3:] == -1).all()
    assert np.bincount(placed, minlength=4)[1] <= 2


def test_jsq_and_least_kv_pick_the_least_loaded():
    view = ClusterView(active=[2, 1, 5], kv_tokens=[10, 900, 20], free_slots=[9, 9, 9])
    one = RequestBatch(prompt_len=[4])
    assert make_router("jsq").reset(3).route(one, view).tolist() == [1]
    assert make_router("least_kv").reset(3).route(one, view).tolist() == [0]


def test_round_robin_cycles():
    view = ClusterView.idle(3)
    rr = make_router("round_robin").reset(3)
    assert rr.route(RequestBatch(prompt_len=np.ones(7)), view).tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_jsq_balances_a_batch_exactly():
    out = make_router("jsq", seed=0).reset(4).route(RequestBatch(prompt_len=np.ones(8)), ClusterView.idle(4))
    assert np.bincount(out, minlength=4).tolist() == [2, 2, 2, 2]


def test_vllm_dp_uses_stale_counts_plus_own_assignments():
    router = make_router("vllm_dp", refresh_s=1.0).reset(2)
    view = ClusterView(active=[0, 5], kv_tokens=[0, 0], free_slots=[99, 99], waiting=[0, 0], time_s=0.0)
    first = router.route(RequestBatch(prompt_len=np.ones(5)), view)
    # scores 4*waiting + running: worker 1 runs 5, so worker 0 takes requests until 4*waiting passes 5
    assert first.tolist() == [0, 0, 1, 0, 1]
    # before the next refresh the stale snapshot plus own increments decide (w0: 12 < w1: 13) ...
    stale = ClusterView(active=[0, 9], kv_tokens=[0, 0], free_slots=[99, 99], waiting=[0, 0], time_s=0.5)
    assert router.route(RequestBatch(prompt_len=[1]), stale).tolist() == [0]
    # ... and after it the published counts do
    fresh = ClusterView(active=[3, 0], kv_tokens=[0, 0], free_slots=[99, 99], waiting=[0, 0], time_s=1.0)
    assert router.route(RequestBatch(prompt_len=[1]), fresh).tolist() == [1]
    with pytest.raises(ValueError, match="refresh_s"):
        make_router("vllm_dp", refresh_s=-1)


def test_view_and_batch_validation():
    with pytest.raises(ValueError, match="kv_tokens must have one entry per worker"):
        ClusterView(active=[0, 0], kv_tokens=[0], free_slots=[1, 1])
    with pytest.raises(ValueError, match="signature must have shape"):
        RequestBatch(prompt_len=[1, 2], signature=np.zeros((3, 4)))
    with pytest.raises(ValueError, match="n_workers"):
        make_router("jsq").reset(0)
