"""Locality statistics on synthetic traces whose answers are known in closed form."""

from __future__ import annotations

import numpy as np
import pytest

from moelab.traces import ExpertTrace, Geometry
from moelab.traces.analysis import (
    domain_expert_mi,
    locality_stats,
    prefill_signatures,
    signature_ari,
    topk_activation_share,
)


def _trace(expert_sets: dict[str, list[int]], n_per: int = 20, L: int = 3, E: int = 16, k: int = 2, T: int = 8, seed: int = 0):
    """Synthetic trace: each domain routes every token (prefill and decode) inside its own expert set."""
    rng = np.random.default_rng(seed)
    ids, doms, prompts, counts, dec = [], [], [], [], []
    for d, experts in expert_sets.items():
        for j in range(n_per):
            P = int(rng.integers(20, 30))  # enough tokens to hit every expert of the set
            pre = np.stack([[rng.choice(experts, k, replace=False) for _ in range(L)] for _ in range(P)])  # [P, L, k]
            c = np.zeros((L, E), np.int32)
            np.add.at(c, (np.broadcast_to(np.arange(L)[None, :, None], pre.shape), pre), 1)
            dec.append(np.stack([[rng.choice(experts, k, replace=False) for _ in range(L)] for _ in range(T)]))
            ids.append(f"{d}{j}")
            doms.append(d)
            prompts.append(rng.integers(0, 100, P))
            counts.append(c)
    return ExpertTrace.from_requests(request_ids=ids, domains=doms, prompt_tokens=prompts, prefill_counts=np.stack(counts),
                                     decode_ids=dec, geometry=Geometry(L, E, k))


def test_disjoint_domains_reach_the_bounds():
    tr = _trace({"a": [0, 1, 2, 3], "b": [4, 5, 6, 7], "c": [8, 9, 10, 11], "d": [12, 13, 14, 15]})
    np.testing.assert_allclose(domain_expert_mi(tr), np.log(4), rtol=1e-9)
    np.testing.assert_allclose(domain_expert_mi(tr, "decode"), np.log(4), rtol=1e-9)
    rec = topk_activation_share(tr, k=4)
    assert rec["activation_share"] == pytest.approx(1.0)
    # global top-4 holds one domain's experts (or a mix): it covers only a quarter of all activations
    assert rec["baseline"] == pytest.approx(0.25, abs=0.1)
    assert signature_ari(tr) == pytest.approx(1.0)
    np.testing.assert_allclose(np.linalg.norm(prefill_signatures(tr), axis=1), 1.0)


def test_shared_experts_carry_no_information():
    tr = _trace({"a": list(range(16)), "b": list(range(16))}, n_per=200, seed=1)
    assert domain_expert_mi(tr).max() < 0.05
    rec = topk_activation_share(tr, k=4)
    assert abs(rec["gain"]) < 0.05
    assert abs(signature_ari(tr)) < 0.1


def test_locality_stats_keys_and_validation():
    tr = _trace({"a": [0, 1, 2], "b": [3, 4, 5]})
    s = locality_stats(tr, k=3)
    assert s["n_requests"] == 40 and s["domains"] == ["a", "b"] and len(s["mi_prefill"]) == 3
    assert s["mi_max"] == pytest.approx(np.log(2))
    with pytest.raises(ValueError, match="k"):
        topk_activation_share(tr, k=17)
    with pytest.raises(ValueError, match="source"):
        domain_expert_mi(tr, "both")
    with pytest.raises(ValueError, match="2 domains"):
        domain_expert_mi(tr.subset(np.arange(10)))
