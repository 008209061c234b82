"""The shipped tiny MoE: loads with plain transformers, its card's numbers are reproducible, training runs."""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from moelab.datasets import bundled_path  # noqa: E402
from moelab.models import TINY_MOE_PATH, load_tiny_moe  # noqa: E402
from moelab.traces import ExpertTrace  # noqa: E402
from moelab.traces.analysis import locality_stats  # noqa: E402


def test_loads_with_plain_automodel_offline():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(TINY_MOE_PATH), local_files_only=True)
    cfg = model.config
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert cfg.num_hidden_layers >= 4 and cfg.num_experts >= 16 and cfg.num_experts_per_tok == 2
    assert cfg.decoder_sparse_step == 1 and not cfg.mlp_only_layers  # every layer is MoE
    weights = TINY_MOE_PATH / "model.safetensors"
    assert weights.stat().st_size <= 25e6
    raw = weights.read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"F16"}
    tok = AutoTokenizer.from_pretrained(str(TINY_MOE_PATH), local_files_only=True)
    assert len(tok) == cfg.vocab_size


def test_greedy_generation_is_deterministic():
    model, tok = load_tiny_moe()
    ids = tok("def main():\n    ", return_tensors="pt")["input_ids"]
    out = [model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False) for _ in range(2)]
    assert out[0].shape[1] == ids.shape[1] + 12 and torch.equal(out[0], out[1])


def _card_numbers() -> dict:
    text = (TINY_MOE_PATH / "MODEL_CARD.md").read_text()
    num = r"([0-9]+\.[0-9]+)"
    found = {
        "mi_max": re.search(rf"MI = {num} nats", text), "activation_share": re.search(rf"activation share@4 = {num}", text),
        "baseline": re.search(rf"baseline \*\*{num}\*\*", text), "ari": re.search(rf"ARI = {num}", text),
    }
    assert all(found.values()), f"model card lacks a statistic: {found}"
    out = {k: float(m.group(1)) for k, m in found.items()}
    rows = re.findall(rf"^\| (\d+) \| {num} \| {num} \| {num} \| {num} \|$", text, flags=re.M)
    out["mi_prefill"] = [float(r[1]) for r in rows]
    out["activation_share_per_layer"] = [float(r[3]) for r in rows]
    # the cluster table: "| domain | n | n | ... |", one column per cluster
    out["confusion"] = [[int(c) for c in re.findall(r"\| (\d+)", line)]
                        for line in re.findall(r"^\| [a-z_]+(?: \| \d+)+ \|$", text, flags=re.M)]
    return out


def test_card_statistics_recomputed_from_bundled_trace():
    trace = ExpertTrace.load(bundled_path("traces", "tiny-moe-heldout.npz"))
    _, names = trace.domain_codes()
    assert len(names) >= 4 and min(trace.domains.count(d) for d in names) >= 100
    assert trace.decode_lens.min() >= 64 and 96 <= trace.prompt_lens.min() and trace.prompt_lens.max() <= 256
    stats = locality_stats(trace, k=4, seed=0)
    card = _card_numbers()
    for key in ("mi_max", "activation_share", "baseline", "ari"):
        assert stats[key] == pytest.approx(card[key], abs=1.5e-3), key
    np.testing.assert_allclose(stats["mi_prefill"], card["mi_prefill"], atol=1.5e-3)
    np.testing.assert_allclose(stats["activation_share_per_layer"], card["activation_share_per_layer"], atol=1.5e-3)
    assert stats["kmeans_confusion"] == card["confusion"]
    # the bars for the shipped model
    assert stats["mi_max"] >= 0.3 and stats["gain"] >= 0.10 and stats["ari"] >= 0.6


def test_training_loop_runs_resumes_and_exports(tmp_path):
    from transformers import AutoModelForCausalLM

    from moelab.make.tiny_moe import main  # = moelab train-moe --preset tiny-moe
    from moelab.models.corpus import build_corpus

    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(6):
        (notes / f"{i}.txt").write_text(f"entry {i}: " + "a small note about mixtures of experts and routers. " * 60)
    build_corpus(tmp_path / "corpus", domains=["arithmetic"], extra_paths=[notes], max_bytes=20_000, heldout_fraction=0.3)
    args = ["--corpus", str(tmp_path / "corpus"), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
            "--vocab", "300", "--layers", "2", "--experts", "4", "--hidden", "32", "--moe-intermediate", "16", "--heads", "2",
            "--kv-heads", "1", "--seq-len", "32", "--batch", "2", "--eval-every", "2", "--ckpt-every", "2", "--eval-windows", "2",
            "--no-progress", "--experts-impl", "eager"]
    assert main([*args, "--token-budget", str(2 * 32 * 3)]) == 0
    state = json.loads((tmp_path / "work" / "state.json").read_text())
    assert state["step"] == 3 and len(state["history"]) == 1
    assert main([*args, "--token-budget", str(2 * 32 * 5)]) == 0  # resumes from step 3
    record = json.loads((tmp_path / "out" / "training.json").read_text())
    assert record["steps"] == 5 and set(record["final_heldout_loss"]) == {"arithmetic", "notes"}
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    assert model.config.num_experts == 4 and model.dtype == torch.float16
    with pytest.raises(ValueError, match="budget"):
        main(args)
    with pytest.raises(ValueError, match="--top-k"):
        main([*args, "--token-budget", "64", "--top-k", "5"])
