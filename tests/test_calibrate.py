"""``moelab calibrate``: the CPU smoke path writes the H200 tables' format and the cost models fit it."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")

from moelab.costmodel import MODEL_SHAPES, AttentionModel, DenseVerifyModel  # noqa: E402
from moelab.datasets import repo_root  # noqa: E402
from moelab.make.calibrate import calibrate, main, smoke_plan  # noqa: E402


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("calib")
    assert main(["--smoke", "--out", str(out), "--reps", "3"]) == 0
    return out


def test_smoke_tables_have_the_h200_format(smoke_dir):
    h200 = repo_root() / "data" / "calibration" / "h200"
    for name in ("moe_step", "attn_step", "dense_verify", "decode_layer"):
        ours, ref = pd.read_csv(smoke_dir / f"{name}.csv"), pd.read_csv(h200 / f"{name}.csv", nrows=2)
        assert list(ours.columns) == list(ref.columns), name
        assert len(ours) > 0 and (ours.select_dtypes("number").to_numpy() > 0).all()
    plan = smoke_plan()
    moe = pd.read_csv(smoke_dir / "moe_step.csv")
    for name, shape in plan.moe_shapes.items():
        rows = moe[moe["model"] == name]
        assert rows["D"].between(shape.top_k, shape.num_experts).all()
        assert (rows["D"] <= rows["B"] * shape.top_k).all()  # a batch cannot touch more experts than it has slots
        np.testing.assert_array_equal(rows["weight_bytes_per_layer"], rows["D"] * shape.expert_bytes)
    env = json.loads((smoke_dir / "env.json").read_text())
    assert env["smoke"] is True and env["device"] == "cpu" and env["copy_GBps"] > 0


def test_cost_models_fit_the_measured_tables(smoke_dir):
    fit = json.loads((smoke_dir / "fit.json").read_text())
    assert "bmm_active" in fit["moe_step"] and fit["moe_step"]["bmm_active"]["points"] > 10
    assert np.isfinite(fit["moe_step"]["bmm_active"]["median_abs_err_pct"])
    assert not set(smoke_plan().moe_shapes) & set(MODEL_SHAPES)  # smoke shapes never enter the registry
    AttentionModel.from_table(pd.read_csv(smoke_dir / "attn_step.csv"))
    dense = DenseVerifyModel(pd.read_csv(smoke_dir / "dense_verify.csv"))
    assert dense.relative_cost("smoke-dense", 1) == pytest.approx(1.0)
    assert fit["dense_verify"]["smoke-dense"]["q=1"] == pytest.approx(1.0)


def test_bad_input(tmp_path, capsys):
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA GPU"):
            calibrate(tmp_path, smoke=False)
        assert main(["--out", str(tmp_path)]) == 2
        assert "--smoke" in capsys.readouterr().err
        with pytest.raises(ValueError, match="no CUDA"):
            calibrate(tmp_path, smoke=True, device="cuda")
    with pytest.raises(ValueError, match="device"):
        calibrate(tmp_path, smoke=True, device="tpu")
    with pytest.raises(ValueError, match="reps"):
        calibrate(tmp_path, smoke=True, reps=0)


def test_attention_table_without_a_bandwidth_bound_point_is_refused_with_a_reason():
    """A table whose times are all near the kernel floor (e.g. overhead-bound CPU timings on a busy machine) cannot
    give a per-GB slope: a clear error, not an empty least-squares fit."""
    flat = pd.DataFrame({"kv_bytes": [1e4, 1e5, 1e6, 1e7], "ms_attn_core": [4.0, 3.9, 4.1, 4.2]})
    with pytest.raises(ValueError, match="no bandwidth-bound attention point"):
        AttentionModel.from_table(flat)


def test_a_smoke_folder_drives_the_step_model_and_dp_cost(smoke_dir):
    """The folder calibrate writes is complete: the simulators' step model and DPCost fit on it."""
    from moelab.costmodel import DecodeStepModel
    from moelab.costmodel.dp import DPCost

    layer = pd.read_csv(smoke_dir / "decode_layer.csv")
    assert set(layer["shape"]) == {smoke_plan().layer_shape} and (layer["ms_per_layer"] > 0).all()
    model = DecodeStepModel.from_calibration(smoke_dir, "tiny-moe")
    assert np.isfinite(model.layer.predict_ms("tiny-moe", 8, 256, 8)) and model.head_ms() > 0
    cost = DPCost.from_calibration(smoke_dir, 2, 4, "tiny-moe")
    assert cost.n_workers == 2 and cost.attn_layers == MODEL_SHAPES["tiny-moe"].num_layers


@pytest.mark.parametrize("table, edit, match", [
    ("attn_step", lambda d: d.drop(columns="kv_bytes"), r"attn_step.csv.*kv_bytes.*required column missing"),
    ("moe_step", lambda d: d.assign(ms_per_layer=d["ms_per_layer"].where(d.index != 2, -1.0)),
     r"moe_step.csv.*ms_per_layer.*finite milliseconds > 0; row 3 has -1.0"),
    ("decode_layer", lambda d: d.assign(B=d["B"].astype(float).where(d.index != 0, 2.5)),
     r"decode_layer.csv.*B.*integers >= 1; row 1 has 2.5"),
])
def test_calibration_tables_are_checked_on_load_naming_file_column_and_row(tmp_path, table, edit, match):
    import shutil

    from moelab.costmodel import DecodeStepModel
    from moelab.costmodel.tables import calibration_folder

    for name in ("moe_step", "attn_step", "decode_layer"):
        shutil.copy(calibration_folder("h200") / f"{name}.csv", tmp_path / f"{name}.csv")
    edit(pd.read_csv(tmp_path / f"{table}.csv")).to_csv(tmp_path / f"{table}.csv", index=False)
    with pytest.raises(ValueError, match=match):
        DecodeStepModel.from_calibration(tmp_path)
