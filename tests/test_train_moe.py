"""The project's OLMoE-like MoE (data/models/sharegpt-moe), `moelab train-moe`, the compact trace codec and
the bundled real traces."""

from __future__ import annotations

import json
from math import comb
from pathlib import Path

import numpy as np
import pytest

from moelab._io import FileFormatError
from moelab.traces import ExpertTrace, concat_traces, load_trace
from moelab.traces.compact import (
    decode_topk_sets,
    encode_topk_sets,
    from_planes,
    load_compact_trace,
    save_compact_trace,
    set_bytes,
    to_planes,
)
from moelab.traces.expert import Geometry

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "data" / "models" / "sharegpt-moe"
TRACES = ROOT / "data" / "traces"


# ---------------------------------------------------------------------------------------------- codec
@pytest.mark.parametrize("E, k", [(64, 8), (32, 2), (128, 8), (8, 8), (5, 1)])
def test_topk_set_rank_round_trip_is_exact(E, k):
    rng = np.random.default_rng(E * 100 + k)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(3000)]).reshape(100, 30, k)
    ranks = encode_topk_sets(ids, E)
    assert ranks.max() < comb(E, k) and ranks.dtype in (np.uint32, np.uint64)
    assert np.array_equal(decode_topk_sets(ranks, E, k), np.sort(ids, axis=-1))
    planes = to_planes(ranks, set_bytes(E, k))
    assert planes.dtype == np.uint8 and np.array_equal(from_planes(planes), ranks.astype(np.uint64))
    extremes = np.array([np.arange(k), np.arange(E - k, E)])
    assert encode_topk_sets(extremes, E).tolist() == [0, comb(E, k) - 1]


def test_codec_refuses_bad_sets_and_ranks():
    with pytest.raises(ValueError, match="distinct"):
        encode_topk_sets(np.array([[1, 1, 2]]), 8)
    with pytest.raises(ValueError, match="num_experts"):
        encode_topk_sets(np.array([[1, 9]]), 8)
    with pytest.raises(ValueError, match="ranks"):
        decode_topk_sets(np.array([comb(8, 2)]), 8, 2)
    assert set_bytes(64, 8) == 5 and set_bytes(32, 2) == 2


def _trace(n=6, L=3, E=16, k=4, seed=0, tag="r"):
    rng = np.random.default_rng(seed)
    plens, dlens = rng.integers(1, 9, n), rng.integers(0, 7, n)

    def ids(T):
        return np.stack([rng.permutation(E)[:k] for _ in range(T * L)]).reshape(T, L, k) if T else np.zeros((0, L, k), int)

    pre = [ids(p) for p in plens]
    return ExpertTrace.from_requests(
        request_ids=[f"{tag}{i}" for i in range(n)], domains=[["a", "b"][i % 2] for i in range(n)],
        prompt_tokens=[rng.integers(0, 500, p) for p in plens],
        prefill_counts=np.stack([np.stack([np.bincount(x[:, layer].ravel(), minlength=E) for layer in range(L)]) for x in pre]),
        decode_ids=[ids(t) for t in dlens], geometry=Geometry(L, E, k, "test"), provenance={"why": "test"},
        decode_tokens=[rng.integers(0, 500, t) for t in dlens])


def test_compact_trace_round_trip_and_concat(tmp_path):
    t = _trace()
    back = load_compact_trace(save_compact_trace(t, tmp_path / "t.npz"))
    assert back.request_ids == t.request_ids and back.domains == t.domains and back.provenance == {"why": "test"}
    for name in ("prompt_tokens", "prompt_offsets", "prefill_counts", "decode_offsets", "decode_tokens"):
        assert np.array_equal(getattr(back, name), getattr(t, name)), name
    assert np.array_equal(back.decode_ids, np.sort(t.decode_ids, axis=-1))
    assert np.array_equal(back.decode_profiles(), t.decode_profiles())
    both = concat_traces([t, _trace(seed=1, tag="s")])
    assert both.n_requests == 12 and both.request_ids[6] == "s0"
    assert np.array_equal(both.decode(7), _trace(seed=1, tag="s").decode(1))
    with pytest.raises(ValueError, match="geometry"):
        concat_traces([t, _trace(E=32)])


def test_compact_trace_load_refuses_bad_files(tmp_path):
    path = save_compact_trace(_trace(), tmp_path / "t.npz")
    with pytest.raises(FileNotFoundError):
        load_compact_trace(tmp_path / "none.npz")
    meta = json.loads(path.with_suffix(".json").read_text())
    meta["geometry"]["num_experts"] = 8  # ranks now exceed C(8, 4)
    path.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(FileFormatError, match="decode_sets"):
        load_compact_trace(path)
    path.write_bytes(b"not a zip")
    with pytest.raises(FileFormatError):
        load_compact_trace(path)


# ---------------------------------------------------------------------------------------------- train-moe
def test_train_moe_sharegpt_preset_trains_on_the_train_part_only(tmp_path):
    from moelab.datasets import load_sharegpt, sharegpt_split
    from moelab.make.train import main

    recs = [{"id": f"chat{i // 2}_{i % 2}", "conversations": [{"from": "human", "value": f"question {i} " * 40},
                                                          {"from": "gpt", "value": f"answer {i} about routers " * 60}]}
            for i in range(120)]
    sg = tmp_path / "sg.json"
    sg.write_text(json.dumps(recs))
    args = ["--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--sharegpt-file", str(sg),
            "--sharegpt-conversations", "80", "--domains", "arithmetic", "--weights", "sharegpt=3,arithmetic=1",
            "--max-bytes", "20000", "--vocab", "300", "--layers", "2", "--experts", "8", "--top-k", "4", "--hidden", "32",
            "--moe-intermediate", "16", "--heads", "2", "--kv-heads", "1", "--seq-len", "32", "--batch", "2",
            "--eval-every", "2", "--ckpt-every", "2", "--eval-windows", "2", "--no-progress", "--experts-impl", "eager",
            "--token-budget", str(2 * 32 * 3)]
    assert main(args) == 0
    record = json.loads((tmp_path / "out" / "training.json").read_text())
    assert record["preset"] == "sharegpt-moe" and record["domain_weights"] == {"arithmetic": 0.25, "sharegpt": 0.75}
    assert record["sharegpt"]["written"] == 80 and "sharegpt" in record["final_heldout_loss"]
    trained = set(json.loads((tmp_path / "out" / "sharegpt_train_ids.json").read_text())["ids"])
    train, held = sharegpt_split(load_sharegpt(path=sg).conversations, 0.2, seed=0)
    assert len(trained) == 80 and trained <= {c.id for c in train} and trained.isdisjoint({c.id for c in held})


@pytest.mark.parametrize("extra, needle", [(["--weights", "a=x"], "--weights"), (["--sharegpt-file", "/nonexistent.json"],
                                                                                  "--sharegpt-file"),
                                           (["--sharegpt-conversations", "-1"], "--sharegpt-conversations"),
                                           (["--preset", "huge"], "invalid choice")])
def test_train_moe_argument_errors(tmp_path, capsys, extra, needle):
    from moelab.cli import main

    try:
        code = main(["train-moe", "--token-budget", "10", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"), *extra])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2 and needle in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- the bundled model and traces
def test_bundled_model_loads_with_plain_from_pretrained_at_olmoe_like_geometry():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert all(f.stat().st_size <= 25 * 2**20 for f in MODEL.iterdir()), "every model file must be <= 25 MB"
    model = AutoModelForCausalLM.from_pretrained(str(MODEL), local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(MODEL), local_files_only=True)
    cfg = model.config
    assert cfg.num_experts >= 64 and cfg.num_experts_per_tok == 8 and cfg.num_hidden_layers >= 8
    assert not cfg.mlp_only_layers and cfg.decoder_sparse_step == 1  # every layer MoE
    ids = tok("User: hello\nAssistant:", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model(input_ids=ids, output_router_logits=True)
    assert len(out.router_logits) == cfg.num_hidden_layers and torch.isfinite(out.logits).all()


def _bundled(which):
    path = TRACES / f"sharegpt-moe-{which}.npz"
    if not path.is_file():
        pytest.fail(f"{path} is missing")
    return path


def test_bundled_sharegpt_trace_is_real_heldout_and_compact():
    path = _bundled("sharegpt")
    assert path.stat().st_size + path.with_suffix(".json").stat().st_size <= 10 * 2**20
    t = load_trace(path)
    cfg = json.loads((MODEL / "config.json").read_text())
    assert (t.geometry.num_layers, t.geometry.num_experts, t.geometry.top_k) == (
        cfg["num_hidden_layers"], cfg.get("num_experts", cfg.get("num_local_experts")), cfg["num_experts_per_tok"])
    assert t.n_requests >= 2000 and t.decode_lens.min() >= 128
    trained = set(json.loads((MODEL / "sharegpt_train_ids.json").read_text())["ids"])
    assert trained.isdisjoint(t.request_ids)
    req = t.provenance["requests"]
    assert req["split"] == "moelab.datasets.sharegpt_split" and t.provenance["decoding"].startswith("greedy")
    assert (t.prefill_counts.sum(axis=2) == t.prompt_lens[:, None] * t.geometry.top_k).all()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["sharegpt", "specbench"])
def test_card_statistics_recomputed_from_bundled_trace(which):
    from moelab.eldr.locality import locality_report

    stats_path = TRACES / f"sharegpt-moe-{which}.stats.json"
    if not (TRACES / f"sharegpt-moe-{which}.npz").is_file() and which == "specbench":
        pytest.skip("the Spec-Bench trace was not bundled")
    recorded = json.loads(stats_path.read_text())
    fresh = json.loads(json.dumps(locality_report(load_trace(TRACES / f"sharegpt-moe-{which}.npz"), **recorded["params"])))
    for key, value in recorded["stats"].items():
        if isinstance(value, float):
            assert fresh[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
        else:
            assert fresh[key] == value, key
    card = (MODEL / "README.md").read_text()
    assert f"{recorded['stats']['rho_count_idf']:.3f}" in card
