"""The deployment what-if analysis (routers over a captured trace), without vLLM: bundled tiny-MoE trace."""

from __future__ import annotations

import numpy as np
import pytest

from moelab.datasets import bundled_path
from moelab.eldr import SignatureBuilder
from moelab.eldr.partition import spherical_kmeans
from moelab.routers import make_router
from moelab.serving.analysis import assign, compare_routers, distinct_per_step
from moelab.traces import ExpertTrace


@pytest.fixture(scope="module")
def small_trace() -> ExpertTrace:
    trace = ExpertTrace.load(bundled_path("traces", "tiny-moe-heldout.npz"))
    return trace.subset(np.arange(0, trace.n_requests, 5))  # 80 requests, every domain


def test_eldr_groups_requests_that_share_experts(small_trace):
    sig = SignatureBuilder().fit(small_trace).transform(small_trace)
    centroids = spherical_kmeans(sig, 4, seed=0).centroids
    cmp = compare_routers(small_trace, sig, centroids, 4, seed=0)
    E = small_trace.geometry.num_experts
    assert all(1 <= v <= E for v in cmp["distinct"].values())
    # grouping by signature must beat every load balancer on distinct experts per step (real trace)
    assert cmp["eldr_reduction_pct"] > 5
    assert np.bincount(cmp["groups"]["eldr"], minlength=4).max() <= -(-small_trace.n_requests // 4)


def test_bad_inputs_are_refused(small_trace):
    router = make_router("jsq")
    lens = small_trace.prompt_lens
    sig = np.zeros((small_trace.n_requests, 3))
    with pytest.raises(ValueError, match="order must be a permutation"):
        assign(router, sig, lens, 2, order=np.zeros(small_trace.n_requests, dtype=int))
    with pytest.raises(ValueError, match="max_steps"):
        distinct_per_step(small_trace, np.zeros(small_trace.n_requests, dtype=int), 1, max_steps=0)


def test_signature_client_refuses_non_finite_counts(monkeypatch):
    """NaN/inf prefill counts from the service are refused before any signature reaches a router."""
    import asyncio

    import moelab.serving.signatures as sigmod

    async def fake_http_json(url, method, path, body, timeout_s):  # the service answering a poisoned payload
        return 200, {"counts": [[1.0, float("nan")], [0.0, 2.0]]}

    monkeypatch.setattr(sigmod, "http_json", fake_http_json)
    client = sigmod.ELDRSignatureClient("http://127.0.0.1:1", builder=None)
    with pytest.raises(ValueError, match="finite"):
        asyncio.run(client.counts({"prompt": "x"}))
    assert client.requests == 0
