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


def test_signature_client_refuses_non_finite_counts():
    """NaN/inf prefill counts from the service are refused before any signature reaches a router."""
    import asyncio

    import moelab.serving.signatures as sigmod

    async def go():
        async def poisoned_service(reader, writer):  # a loopback service answering a poisoned payload
            await reader.readuntil(b"\r\n\r\n")
            body = b'{"counts": [[1.0, NaN], [0.0, 2.0]]}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(poisoned_service, "127.0.0.1", 0)
        client = sigmod.ELDRSignatureClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", builder=None)
        try:
            with pytest.raises(ValueError, match="finite"):
                await client.counts({"prompt": "x"})
        finally:
            server.close()
        return client

    assert asyncio.run(go()).requests == 0
