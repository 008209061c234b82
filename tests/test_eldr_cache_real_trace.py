"""The signature cache on real routing ids: a prompt served from the cache gets exactly the counts a full
prefill gives (the invariant that keeps ELDR's signatures exact under prefix caching).

Moved out of notebook 01's lesson (issue 26): the notebook measures the invariant on its shared-prefix
workload; this test checks it on the bundled real trace that keeps per-token routing ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moelab.eldr.cache import SignatureCache
from moelab.traces import ExpertTrace

REAL_TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "tiny-moe-heldout.npz"
BLOCK = 16
REQUESTS = 50


def test_cached_prompts_get_full_prefill_counts_on_real_routing():
    trace = ExpertTrace.load(REAL_TRACE)
    assert trace.prefill_ids is not None, "the tiny-MoE held-out trace keeps per-token prefill routing ids"
    g = trace.geometry
    cache = SignatureCache(BLOCK, g.num_layers, g.num_experts, capacity_blocks=4096)
    served_from_cache = 0
    for i in range(min(trace.n_requests, REQUESTS)):
        ids = trace.prefill_topk(i)
        cache.admit(f"a{i}", trace.prompt(i), ids)
        hit = cache.lookup(trace.prompt(i))
        served_from_cache += hit
        poisoned = ids.copy()
        poisoned[:hit] = 0  # tokens served from the cache are never read: garbage there must not matter
        cache.admit(f"b{i}", trace.prompt(i), poisoned)
        assert np.array_equal(cache.counts(f"b{i}"), trace.prefill_counts[i]), f"request {i}"
        cache.release(f"a{i}")
        cache.release(f"b{i}")
    assert served_from_cache > 0  # the repeats really were served from the cache


def test_recorded_selection_counts_what_the_length_limit_left_out():
    """Seventh student read: the Spec-Bench trace is not the whole benchmark (prompts over the recording's limit
    were skipped); what it kept is read from the trace's provenance and adds up."""
    import pandas as pd  # lazy: only this test builds source labels

    from moelab.eldr.locality import recorded_selection
    from moelab.traces import bundled_trace_path

    assert recorded_selection("no-such-trace") is None
    if not bundled_trace_path("sharegpt-moe-specbench").exists():
        pytest.skip("the Spec-Bench trace is not bundled here")
    sel = recorded_selection("sharegpt-moe-specbench")
    assert sel["kept"] + sel["skipped_too_long"] == sel["questions"] and sel["max_len"] > 0
    assert sum(sel["kept_by_label"].values()) == sel["kept"] and "labels_left_out" not in sel
    # with source labels: one label kept whole, one thinned, one left out entirely
    kept = sel["kept_by_label"]
    whole, thin = sorted(kept)[:2]
    source = pd.Series([whole] * kept[whole] + [thin] * (kept[thin] + 3) + ["absent"] * 2)
    sel = recorded_selection("sharegpt-moe-specbench", source)
    assert sel["labels_left_out"] == ["absent"] and sel["labels_thinned"] == {thin: (kept[thin], kept[thin] + 3)}
