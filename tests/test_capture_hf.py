"""HF hook capture: the shipped tiny MoE, tiny random configs of four MoE families, bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from moelab.capture import capture  # noqa: E402
from moelab.capture.hf import find_routers  # noqa: E402
from moelab.traces import ExpertTrace  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    from moelab.models.tiny_moe import load_tiny_moe

    return load_tiny_moe()


def _prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, int(m)).tolist() for m in rng.integers(12, 40, n)]


def test_tiny_moe_8x16_hook_ids_equal_router_logits_topk(tiny, tmp_path):
    model, tok = tiny
    texts = ["def parse(path):\n    with open(path) as f:", "#include <stdio.h>\nint main(void) {", "417 + 38 = 455\n12 * 7 =",
             "NAME\n    ls - list directory contents", "Permission is hereby granted, free of charge,",
             "import os\nimport sys\n", "struct stat {\n  dev_t st_dev;", "This program is free software; you can"]
    tr = capture((model, tok), texts, 16, domains=[f"d{i % 3}" for i in range(8)])  # self_check=True by default
    g = tr.geometry
    assert len(tr) == 8 and (g.num_layers, g.num_experts, g.top_k) == (model.config.num_hidden_layers, model.config.num_experts, 2)
    assert np.all(tr.decode_lens == 16)
    np.testing.assert_array_equal(tr.prefill_counts.sum(axis=2), np.repeat(tr.prompt_lens[:, None], g.num_layers, 1) * g.top_k)
    np.testing.assert_allclose(tr.prefill_probs.sum(axis=2), np.repeat(tr.prompt_lens[:, None], g.num_layers, 1), rtol=1e-4)
    assert tr.provenance["backend"] == "hf" and tr.provenance["self_checked"]
    # independent check: one uncached forward over prompt + generated tokens, with output_router_logits
    with torch.inference_mode():
        for i in range(len(tr)):
            seq = np.concatenate([tr.prompt(i), tr.decode_tokens[tr.decode_offsets[i]:tr.decode_offsets[i + 1]]])
            out = model(input_ids=torch.tensor(seq[None], dtype=torch.long), output_router_logits=True)
            ref = np.stack([torch.topk(torch.softmax(r.float(), -1), g.top_k, -1).indices.numpy() for r in out.router_logits], 1)
            got = np.concatenate([tr.prefill_topk(i), tr.decode(i)])
            np.testing.assert_array_equal(np.sort(ref, -1), np.sort(got, -1))
    # greedy decoding reproduces transformers' own generate()
    ids = torch.from_numpy(tr.prompt(0)[None].astype(np.int64))
    gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)[0, ids.shape[1]:]
    np.testing.assert_array_equal(gen.numpy(), tr.decode_tokens[:16])
    back = ExpertTrace.load(tr.save(tmp_path / "t"))
    np.testing.assert_array_equal(back.decode_ids, tr.decode_ids)


def test_batched_capture_matches_batch_one(tiny):
    model, tok = tiny
    prompts = _prompts(4, model.config.vocab_size, seed=3)
    a = capture((model, tok), prompts, 6, progress=False)
    b = capture((model, tok), prompts, 6, progress=False, batch_size=4)
    np.testing.assert_array_equal(a.prompt_lens, b.prompt_lens)
    # left padding changes matmul shapes, so rare near-ties may flip; tokens and almost all ids agree
    assert np.mean(np.sort(a.prefill_ids, -1) == np.sort(b.prefill_ids, -1)) > 0.99
    assert np.mean(np.sort(a.decode_ids, -1) == np.sort(b.decode_ids, -1)) > 0.97


def _random_moe(kind: str):
    from transformers import (
        MixtralConfig,
        MixtralForCausalLM,
        OlmoeConfig,
        OlmoeForCausalLM,
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    common = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=128, num_experts_per_tok=2)
    torch.manual_seed(0)
    if kind == "qwen3_moe":
        return Qwen3MoeForCausalLM(Qwen3MoeConfig(**common, num_experts=8, moe_intermediate_size=16, intermediate_size=64))
    if kind == "qwen2_moe":
        return Qwen2MoeForCausalLM(Qwen2MoeConfig(**common, num_experts=8, moe_intermediate_size=16, intermediate_size=64,
                                                  shared_expert_intermediate_size=32))
    if kind == "mixtral":
        return MixtralForCausalLM(MixtralConfig(**common, num_local_experts=8, intermediate_size=16))
    return OlmoeForCausalLM(OlmoeConfig(**common, num_experts=8, intermediate_size=16))


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe"])
def test_random_configs_of_four_moe_families(kind):
    model = _random_moe(kind).eval()
    assert len(find_routers(model)) == 2
    tr = capture(model, _prompts(3, 128), 4, progress=False, batch_size=2)  # self-check on every token
    assert tr.geometry.num_experts == 8 and tr.geometry.top_k == 2 and tr.decode_ids.shape == (12, 2, 2)
    assert np.all(tr.prefill_counts.sum(axis=2) == tr.prompt_lens[:, None] * 2)


def test_bad_inputs(tiny):
    with pytest.raises(ValueError, match="prompts"):
        capture(tiny, [], 4)
    with pytest.raises(ValueError, match="prompts"):
        capture(tiny, "just a string", 4)
    with pytest.raises(ValueError, match="empty"):
        capture(tiny, [""], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        capture(tiny, ["hello"], 0)
    with pytest.raises(ValueError, match="backend"):
        capture(tiny, ["hello"], 4, backend="tgi")
    with pytest.raises(ValueError, match="domains"):
        capture(tiny, ["a", "b"], 4, domains=["x"])
    with pytest.raises(ValueError, match="no-such-model"):
        capture("no-such-model", ["hello"], 4)
    with pytest.raises(ValueError, match="ids in"):
        capture(tiny, [[10**7]], 4)
    with pytest.raises(ValueError, match="router"):
        from transformers import LlamaConfig, LlamaForCausalLM

        dense = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=2))
        capture(dense, [[1, 2, 3]], 2)


def test_vllm_backend_missing_is_a_clear_error(tiny, monkeypatch):
    from moelab.models import vllm_engine

    monkeypatch.setattr(vllm_engine, "_installed_version", lambda: None)  # as on a machine without vLLM
    with pytest.raises(vllm_engine.VLLMUnavailableError, match="vLLM is not installed"):
        capture(tiny, ["hello"], 2, backend="vllm")
