"""Bundled calibration tables, fitted component models, public-data loader."""

from __future__ import annotations

import numpy as np
import pytest

from moelab import datasets
from moelab.costmodel import AttentionModel, DenseVerifyModel, MoEStepModel


def test_moe_model_fits_measured_points_and_orders_by_experts():
    model = MoEStepModel.h200()
    assert model.report.median_abs_err_pct < 10
    t = model.predict_ms("qwen3-30b-a3b", 256, np.array([8, 128]))
    assert t[1] > 4 * t[0]  # the physical fact behind ELDR: distinct experts dominate
    with pytest.raises(ValueError, match="D must be in"):
        model.predict_ms("qwen3-30b-a3b", 8, 129)
    with pytest.raises(ValueError, match="shape must be one of"):
        model.predict_ms("gpt-5", 8, 8)
    with pytest.raises(ValueError, match=r"method 'magic' has no rows in the moe_step table: its 'method' column holds \['bmm_active'"):
        MoEStepModel.from_table(datasets.load_calibration("h200", "moe_step"), "magic")


def test_attention_and_verify_models():
    attn = AttentionModel.h200()
    assert attn.report.median_abs_err_pct < 10
    kv = AttentionModel.kv_bytes(np.array([512, 8192 * 256]))  # one short request vs a full batch
    small, big = attn.predict_ms(kv)
    assert small == pytest.approx(attn.floor_ms, rel=0.5) and big > 10 * small
    verify = DenseVerifyModel.h200()
    rel = verify.relative_cost("llama2-7b", [1, 16, 28])
    assert rel[0] == 1.0 and 1.0 < rel[1] < rel[2] < 1.3
    with pytest.raises(ValueError, match="q must be in"):
        verify.predict_ms("llama2-7b", 1000)


def test_calibration_loader_errors():
    with pytest.raises(ValueError, match="gpu must be one of"):
        datasets.load_calibration("tpu")
    with pytest.raises(ValueError, match="table must be one of"):
        datasets.load_calibration("h200", "nope")


def test_public_loaders_read_local_copy(public_data):
    sb = datasets.load_spec_bench()
    assert len(sb) == 480 and set(sb["category"]) == set(datasets.SPEC_BENCH_CATEGORIES)
    assert (sb["category"] == "mt_bench").sum() == 80
    assert {"model", "rate_rps", "eldr"} <= set(datasets.load_eldr_results().columns)
    counts = datasets.load_routing_counts("olmoe")
    assert "expert_counts" in counts
    with pytest.raises(ValueError, match="name must be one of"):
        datasets.public_path("imagenet")


def test_bundled_copy_is_used_offline_and_local_copy_wins(monkeypatch, tmp_path):
    monkeypatch.delenv("MOELAB_PUBLIC_DATA", raising=False)
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path / "cache"))
    path = datasets.public_path("eldr-results", download=False)
    assert path == datasets.bundled_public_root() / "eldr-results" / "main_task_p50_tpot_ms.csv"
    # every bundled folder carries its provenance, and every bundled file's sha256 is listed there
    import hashlib

    for folder in datasets.bundled_public_root().iterdir():
        provenance = (folder / "PROVENANCE.md").read_text(encoding="utf-8")
        for f in folder.iterdir():
            if f.name != "PROVENANCE.md" and f.suffix in {".csv", ".json", ".jsonl"}:
                assert hashlib.sha256(f.read_bytes()).hexdigest() in provenance, f
    # a larger local copy pointed at by MOELAB_PUBLIC_DATA is read first
    local = tmp_path / "mirror" / "eldr-results"
    local.mkdir(parents=True)
    (local / "main_task_p50_tpot_ms.csv").write_text("model,rate_rps,eldr\nx,1,2\n")
    monkeypatch.setenv("MOELAB_PUBLIC_DATA", str(tmp_path / "mirror"))
    assert datasets.public_path("eldr-results") == local / "main_task_p50_tpot_ms.csv"


def test_missing_unbundled_data_says_where_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv("MOELAB_PUBLIC_DATA", str(tmp_path))
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="MOELAB_PUBLIC_DATA"):
        datasets.public_path("azure-2024-conv", download=False)


def test_expected_distinct_experts_limits():
    from moelab.costmodel import expected_distinct_experts

    d = expected_distinct_experts(np.array([0, 1, 10_000]), 128, 8)
    assert d[0] == 0 and d[1] == pytest.approx(8) and d[2] == pytest.approx(128)
    # Monte Carlo of uniform top-8 routing agrees with the closed form
    rng = np.random.default_rng(0)
    sims = [len({e for _ in range(32) for e in rng.choice(128, 8, replace=False)}) for _ in range(400)]
    assert np.mean(sims) == pytest.approx(expected_distinct_experts(32, 128, 8), rel=0.02)


def test_attention_per_token_form_matches_the_model():
    attn = AttentionModel.h200()
    per_token = float(AttentionModel.kv_bytes(1))
    floor, base, slope = attn.per_token_coefficients(per_token)
    tokens = np.array([0, 512, 256 * 8192])
    assert np.allclose(np.maximum(floor, base + slope * tokens), attn.predict_ms(tokens * per_token))
